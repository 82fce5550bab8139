#!/usr/bin/env bash
# Records the small GPU trace fixtures under tests/fixtures (run on the device; commit the
# result). A few steps of a small batch: real torch 2.11 CUDA traces that stay small.
# `record_fixtures.sh DEST ddp` records only the two-rank fixtures (two GPUs): each rank's
# trace of a make profile GPUS=2 run and its summary, for TensorBoard's Distributed view.
# `record_fixtures.sh DEST ncu` records only ncu's raw CSV of the trunk (bench/trunk_ncu.py).
set -euo pipefail
cd "$(dirname "$0")/.."
dest=${1:-tests/fixtures}
mkdir -p "$dest"
tmp=$(mktemp -d)
common=(--preset gpu --batch-size 32 --image-size 64 --hidden 256 --num-workers 2
        --wait 1 --warmup 1 --active 2 --no-compile --out-dir "$tmp")
if [ "${2:-}" = ncu ]; then
  python3 bench/trunk_ncu.py --out "$tmp/ncu" -- --backend cuda >/dev/null
  gzip -c "$tmp/ncu/raw.csv" > "$dest/gpu_trunk_ncu_raw.csv.gz"
  ls -la "$dest"/gpu_trunk_ncu_raw.csv.gz
  exit 0
fi
if [ "${2:-}" = ddp ]; then
  # hidden 4096: lin1's gradient (16 M elements) is an all-reduce long enough to see.
  python3 -m training.launch --nproc 2 train.py "${common[@]}" --hidden 4096 --loss padded \
    --run-name ddp >/dev/null
  for r in 0 1; do cp "$tmp"/ddp/rank$r.*.pt.trace.json.gz "$dest/gpu_ddp_rank$r.pt.trace.json.gz"; done
  cp "$tmp/ddp/summary.json" "$dest/gpu_ddp_train.summary.json"
  ls -la "$dest"/gpu_ddp_*
  exit 0
fi
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
