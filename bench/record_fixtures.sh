#!/usr/bin/env bash
# Records the small GPU trace fixtures under tests/fixtures (run on the device; commit the
# result). A few steps of a small batch: real torch 2.11 CUDA traces that stay small.
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-tests/fixtures}
mkdir -p "$dest"
tmp=$(mktemp -d)
common=(--preset gpu --batch-size 32 --image-size 64 --hidden 256 --num-workers 2
        --wait 1 --warmup 1 --active 2 --no-compile --out-dir "$tmp")
for loss in padded kernel; do
  python3 train.py "${common[@]}" --loss "$loss" --run-name "$loss" >/dev/null
  cp "$tmp/$loss"/*.pt.trace.json.gz "$dest/gpu_${loss}_train.pt.trace.json.gz"
  cp "$tmp/$loss/summary.json" "$dest/gpu_${loss}_train.summary.json"
done
# A CUDA-graph run: its step is one replay (the 'graph' range).
python3 train.py "${common[@]/--wait/--wait}" --wait 2 --cuda-graph on --run-name graph >/dev/null
cp "$tmp/graph"/*.pt.trace.json.gz "$dest/gpu_graph_train.pt.trace.json.gz"
cp "$tmp/graph/summary.json" "$dest/gpu_graph_train.summary.json"
ls -la "$dest"
