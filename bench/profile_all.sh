#!/usr/bin/env bash
# Runs `make profile` for the given strategies in the given modes at the full GPU preset
# and copies each run's summary.json to DEST (default: results/runs). Usage:
#   bench/profile_all.sh DEST "loop concat padded kernel:triton ..." "forward train"
# The loop strategy gets 3 profiled steps (it takes seconds per step at batch 1024).
set -uo pipefail
cd "$(dirname "$0")/.."
dest=${1:-results/runs}; strategies=${2:-"loop concat padded kernel:triton conditional:triton kernel:cuda conditional:cuda"}
modes=${3:-"forward train"}
mkdir -p "$dest"
for mode in $modes; do
  for s in $strategies; do
    loss=${s%%:*}; kernel=triton; [[ $s == *:* ]] && kernel=${s##*:}
    extra=(); [[ $loss == loop ]] && extra=(--active 3)
    name="$loss$([[ $loss == kernel || $loss == conditional ]] && echo "-$kernel")-$mode"
    echo "=== $name"
    start=$(date +%s)
    if python3 train.py --loss "$loss" --kernel "$kernel" --mode "$mode" "${extra[@]}" \
         --run-name "$name" > "$dest/$name.log" 2>&1; then
      dir=$(ls -d profiles/"$name"* | tail -1)
      cp "$dir/summary.json" "$dest/$name.summary.json"
      # Archived after every run, so a later run that is cut off loses nothing.
      tar rf "$dest.tar" -C "$dest" "$name.summary.json" "$name.log"
      sed -n '/^### /,/^mean over/p' "$dest/$name.log"
    else
      echo "FAILED ($name), last lines:"; tail -5 "$dest/$name.log"
    fi
    echo "($(( $(date +%s) - start )) s)"
  done
done
# (The device returns at most 8 files: $dest.tar holds every run's summary and log.)
