#!/usr/bin/env bash
# Everything this repo measures on a GPU, in stages meant to fit one 10-minute device call
# each. Times seen on the H100 on 2026-11-22: make test-gpu 2.5 min; 35-45 s a run for
# every strategy but the loop (forward: 8 runs); the loop's train run did not finish in
# 130 s, so it has a stage of its own.
#   bench/device_session.sh tests       # make test-gpu (pytest + compute-sanitizer)
#   bench/device_session.sh forward     # make compare, forward mode, every strategy
#   bench/device_session.sh train       # make compare, train mode, all but the loop
#   bench/device_session.sh loop-train  # the loop in train mode; then the combined table
#   bench/device_session.sh overhead    # bench/loss_overhead.py
# Results go to $OUT (the device tool returns at most 8 files) as one archive per stage.
# The comparison's runs collect in profiles/compare-device/. Where the tree has no .git (the
# device machine), export GIT_COMMIT=<sha> first so that every summary names its commit.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-results-device}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
cmp=profiles/compare-device
case ${1:?stage: tests, forward, train or overhead} in
  tests)
    timeout 420 make test-gpu > "$out/test-gpu.log" 2>&1
    echo "make test-gpu: exit $?"
    grep -E "passed|failed|ERROR SUMMARY" "$out/test-gpu.log" | tail -3 ;;
  forward|train|loop-train)
    case $1 in
      forward) args=(--modes forward) ;;
      train) args=(--modes train --strategies \
                   concat,padded,compiled,kernel:triton,conditional:triton,kernel:cuda,conditional:cuda) ;;
      loop-train) args=(--modes train --strategies loop) ;;
    esac
    python3 -m profiling.run_comparison --out "$cmp" "${args[@]}" 2>&1 \
      | grep -vE "^\[.*\] step [0-9]|USDT" > "$out/compare-$1.log"
    if [[ $1 == loop-train ]]; then  # the combined table of every run so far
      python3 -m profiling.run_comparison --runs "$cmp"/*-forward* "$cmp"/*-train* >/dev/null
    fi
    tar czf "$out/compare-$1.tgz" "$cmp"/*.md "$cmp"/*.csv "$cmp"/*.png "$cmp"/*/summary.json \
      "$out/compare-$1.log" 2>/dev/null
    tail -3 "$out/compare-$1.log" ;;
  overhead)
    python3 bench/loss_overhead.py | tee "$out/loss_overhead.md" ;;
  *) echo "unknown stage $1" >&2; exit 2 ;;
esac
