#!/usr/bin/env bash
# The loss range of the original's measurement (forward mode) under different host
# set-ups: is its host time the loss's own, or the machine around it? GPU preset.
#   bench/loss_range_variants.sh [LOSS KERNEL [VARIANT...]]    # default: kernel cuda, all
# A variant is train.py options, after bench/host_variant.py options and a '--' if any.
# Prints per variant the loss range's CPU ms per step and the last step's timeline;
# runs go to profiles/loss-range-variants/.
set -uo pipefail
cd "$(dirname "$0")/.."
loss=${1:-kernel}
kernel=${2:-cuda}
shift $(( $# < 2 ? $# : 2 ))
dest=profiles/loss-range-variants
mkdir -p "$dest"
if (( $# )); then variants=("$@"); else
  variants=("" "--num-workers 0" "--num-workers 4" "--main-cores 2" "--main-cores 4"
            "--sched spin --" "--sched blocking --" "--gc off --" "--no-compile")
fi
lscpu | grep -E "^CPU\(s\)|Thread|Core|Socket|NUMA node[0-9]" || true
for v in "${variants[@]}"; do
  name="$loss-$kernel${v// /}"
  # host_variant.py with no options of its own is train.py as it is.
  python3 bench/host_variant.py $v --loss "$loss" --kernel "$kernel" --mode forward --out-dir "$dest" \
    --run-name "$name" > "$dest/$name.log" 2>&1 || { tail -3 "$dest/$name.log"; continue; }
  python3 - "$dest/$name/summary.json" "${v:-default}" <<'PY'
import json, sys
s = json.load(open(sys.argv[1]))
p = s["phases"]
print(f"{sys.argv[2]:>20}: loss CPU {p['loss']['cpu_ms']:.3f} ms, GPU {p['loss']['gpu_ms']:.3f} ms;"
      f" forward CPU {p['forward']['cpu_ms']:.2f} ms; data CPU {p['data']['cpu_ms']:.2f} ms;"
      f" step {s['step']['cpu_ms']:.1f} ms")
PY
  python3 -m profiling.range_timeline "$dest/$name" --steps 1
done
