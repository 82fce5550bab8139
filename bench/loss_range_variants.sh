#!/usr/bin/env bash
# The loss range of the original's measurement (forward mode) under different host
# set-ups: is its host time the loss's own, or the machine around it? GPU preset.
#   bench/loss_range_variants.sh [LOSS KERNEL]     # default: kernel cuda
# Prints per variant the loss range's CPU ms per step and the last step's timeline;
# runs go to profiles/loss-range-variants/.
set -uo pipefail
cd "$(dirname "$0")/.."
loss=${1:-kernel}
kernel=${2:-cuda}
dest=profiles/loss-range-variants
mkdir -p "$dest"
variants=("" "--num-workers 0" "--num-workers 4" "--main-cores 2" "--main-cores 4")
lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|NUMA node[0-9]" || true
for v in "${variants[@]}"; do
  name="$loss-$kernel${v// /}"
  python3 train.py --loss "$loss" --kernel "$kernel" --mode forward --out-dir "$dest" \
    --run-name "$name" $v > "$dest-$name.log" 2>&1 || { tail -3 "$dest-$name.log"; continue; }
  python3 - "$dest/$name/summary.json" "${v:-default}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
p = s["phases"]
print(f"{sys.argv[2]:>18}: loss CPU {p['loss']['cpu_ms']:.3f} ms, GPU {p['loss']['gpu_ms']:.3f} ms;"
      f" data CPU {p['data']['cpu_ms']:.2f} ms; step {s['step']['cpu_ms']:.1f} ms")
PY
  python3 -m profiling.range_timeline "$dest/$name" --steps 1
done
