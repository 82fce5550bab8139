#!/usr/bin/env bash
# Everything this repo measures on a GPU, as stages run in order within one device call
# (10 minutes at most; the device tool returns at most 8 files, so each stage leaves one
# log or archive in $OUT):
#   bench/device_session.sh tests overhead compare timeline
#     tests     make test-gpu (pytest -m gpu, then compute-sanitizer over both kernels):
#               at 319f919 pytest alone took 8 min 42 s on the H100 and the sanitizer
#               did not fit in the same call; at 8fe9aed both fit (8 min 7 s + the
#               sanitizer, 570 s with DEADLINE=585); where they do not, run it alone with
#     sanitize  compute-sanitizer memcheck over tests/sanitize_kernels.py only
#     overhead  bench/loss_overhead.py: the host cost of one loss call, layer by layer
#     compare   make compare (every strategy, both modes) into profiles/compare-device/
#     ladder    make ladder (the step's speed-ups one at a time; LADDER= strategies) into
#               profiles/ladder-device/
#     timeline  what the host does inside the loss range of compare's forward-mode runs
#               of the padded-layout strategies
#     sweep     make sweep (each loss alone over batch, capacity, boxes per image) into
#               profiles/sweep-device/
#     blocks    bench/conditional_blocks.py (the Triton kernels' shapes, both variants)
#     kernels   bench/loss_kernels.py (a fused loss call's GPU time kernel by kernel, both
#               backends, beside a memset of its gradient's bytes)
#     loader    bench/loader_rate.py (the data loader alone: where a batch's host time goes,
#               batches/s at 8, 16 and 32 workers, pinned and not)
#     ddptests  the two-GPU tests (tests/test_gpu_distributed.py) and the two-rank trace
#               fixtures of TensorBoard's Distributed view (bench/record_fixtures.sh ddp)
#     throughput  make throughput (each strategy over an epoch, sustained against the GPU's
#               rate) into profiles/throughput-device[-TAG]/; THROUGHPUT_ARGS= its options
#               (e.g. "--strategies padded,kernel:cuda --no-copy-ahead"), TAG= a suffix
#     scaling   one GPU against two (make profile GPUS=2) for padded and kernel/cuda at
#               the GPU preset, then each DDP knob on padded; SCALING_KNOBS= picks the
#               knob runs ("" for none); profiles/scaling-device/, scaling.md
# DEADLINE (seconds from the start, default 570) stops a stage that would run past it, so
# the archives still get written. The device's copy of the tree carries a stale .git:
# export GIT_COMMIT=<sha of the tree sent> first so that every summary names its commit.
set -uo pipefail
cd "$(dirname "$0")/.."
out=${OUT:-results-device}
mkdir -p "$out"
export PYTHONUNBUFFERED=1
cmp=profiles/compare-device
deadline=${DEADLINE:-570}
left() { echo $((deadline - SECONDS > 1 ? deadline - SECONDS : 1)); }
stamp() { printf '[%4d s] %s\n' "$SECONDS" "$*"; }

for stage in "$@"; do
  stamp "stage $stage"
  case $stage in
    tests)
      timeout "$(left)" make test-gpu > "$out/test-gpu.log" 2>&1
      stamp "make test-gpu: exit $?"
      grep -E "passed|failed|ERROR SUMMARY" "$out/test-gpu.log" | tail -3 ;;
    sanitize)
      timeout "$(left)" compute-sanitizer --tool memcheck --error-exitcode 1 \
        python3 tests/sanitize_kernels.py > "$out/sanitizer.log" 2>&1
      stamp "compute-sanitizer: exit $?"
      grep -E "WRONG|ERROR SUMMARY" "$out/sanitizer.log" | tail -3 ;;
    overhead)
      timeout "$(left)" python3 bench/loss_overhead.py > "$out/loss_overhead.md" 2>&1
      cat "$out/loss_overhead.md" ;;
    compare)
      # Per-step progress lines are left out of the log; each run's table stays.
      ( time timeout "$(left)" make compare ARGS="--out $cmp" ) 2>&1 \
        | grep -vE "^\[.*\] step [0-9]|USDT" > "$out/compare.log"
      tar czf "$out/compare.tgz" "$cmp"/*.md "$cmp"/*.csv "$cmp"/*.png "$cmp"/*.json \
        "$cmp"/*/summary.json 2>/dev/null
      grep -E "^\[[0-9]+/[0-9]+\]|all runs done|^real" "$out/compare.log" ;;
    ladder)
      lad=profiles/ladder-device
      ( time timeout "$(left)" make ladder ARGS="--out $lad" ) 2>&1 \
        | grep -vE "^\[.*\] step [0-9]|USDT" > "$out/ladder.log"
      tar czf "$out/ladder.tgz" "$lad"/*.md "$lad"/*.csv "$lad"/*.png "$lad"/*.json \
        "$lad"/*/summary.json 2>/dev/null
      grep -E "^\[[0-9]+/[0-9]+\]|all rungs done|^real|Error|error" "$out/ladder.log"
      cat "$lad/ladder.md"
      for run in "$lad"/*-cuda_graph; do  # is the GPU ever idle under the graph?
        echo "## $run"; python3 bench/step_gaps.py "$run" --gaps 4
      done > "$out/step_gaps.txt" 2>&1
      head -c 2500 "$out/step_gaps.txt" ;;
    sweep)
      sw=profiles/sweep-device
      ( time timeout "$(left)" make sweep ARGS="--out $sw" ) 2>&1 | grep -v USDT \
        > "$out/sweep.log"
      tar czf "$out/sweep.tgz" "$sw"/sweep.* 2>/dev/null
      grep -E "sweep done|^real|failed" "$out/sweep.log" | tail -5 ;;
    blocks)
      timeout "$(left)" python3 bench/conditional_blocks.py 2>&1 | grep -v USDT \
        > "$out/conditional_blocks.txt"
      cat "$out/conditional_blocks.txt" ;;
    kernels)
      timeout "$(left)" python3 bench/loss_kernels.py 2>&1 | grep -vE "USDT|UserWarning|_warn_once" \
        > "$out/loss_kernels.txt"
      cat "$out/loss_kernels.txt" ;;
    timeline)
      for run in "$cmp"/{padded,compiled,kernel-*,conditional-*}-forward; do  # not the
        # loop's or concat's: thousands of operators per range
        echo "## $run"
        timeout "$(left)" python3 -m profiling.range_timeline "$run" --range loss --steps 2
      done > "$out/timeline.txt" 2>&1
      head -c 3000 "$out/timeline.txt" ;;
    loader)
      timeout "$(left)" python3 bench/loader_rate.py --loaders ${LOADERS:-ring,torch} \
        > "$out/loader_rate.md" 2>&1
      cat "$out/loader_rate.md" ;;
    throughput)
      tp=profiles/throughput-device${TAG:+-$TAG}
      ( time timeout "$(left)" make throughput ARGS="--out $tp ${THROUGHPUT_ARGS:-}" ) 2>&1 \
        | grep -vE "^\[.*\] step [0-9]|USDT" > "$out/throughput${TAG:+-$TAG}.log"
      tar czf "$out/throughput${TAG:+-$TAG}.tgz" "$tp"/*.md "$tp"/*.csv "$tp"/*.png \
        "$tp"/*.json "$tp"/*/summary.json 2>/dev/null
      grep -E "^\[[0-9]+/[0-9]+\]|^sustained|^data wait|^the loader|^real|rror" \
        "$out/throughput${TAG:+-$TAG}.log"
      cat "$tp/throughput.md" ;;
    hta)
      python3 -c "import hta, sys; print('HTA', getattr(hta, '__version__', '?'), hta.__file__)" \
        2>&1 | tail -1 ;;
    ddptests)
      timeout "$(left)" python3 -m pytest -q -m gpu tests/test_gpu_distributed.py \
        > "$out/ddptests.log" 2>&1
      stamp "two-GPU tests: exit $?"; tail -3 "$out/ddptests.log"
      timeout "$(left)" bash bench/record_fixtures.sh tests/fixtures ddp > "$out/fixtures.log" 2>&1
      stamp "fixtures: exit $?"; tail -4 "$out/fixtures.log"
      tar czf "$out/ddp_fixtures.tgz" tests/fixtures/gpu_ddp_* ;;
    scaling)
      sc=profiles/scaling-device
      run_one() { timeout "$(left)" python3 train.py --out-dir $sc "$@" 2>&1 | grep -vE "step [0-9]|USDT"; }
      nccl=()  # NCCL_* settings of one knob's run
      run_two() { timeout "$(left)" env "${nccl[@]}" python3 -m training.launch --nproc 2 train.py --out-dir $sc "$@" 2>&1 | grep -vE "step [0-9]|USDT"; }
      {
        for lb in padded:triton kernel:cuda; do
          l=${lb%:*}; b=${lb#*:}
          run_one --loss "$l" --backend "$b" --run-name "one-$l"
          run_two --loss "$l" --backend "$b" --run-name "two-$l" --scaling-baseline "$sc/one-$l"
        done
        for knob in ${SCALING_KNOBS-bucket-view bucket-mb-100 bucket-mb-5 comm-hook-sum comm-hook-bf16 no-overlap nccl-simple sum-bucket-view}; do
          nccl=()
          case $knob in
            bucket-view) flags=(--bucket-view) ;;
            bucket-mb-*) flags=(--bucket-mb "${knob#bucket-mb-}") ;;
            comm-hook-*) flags=(--comm-hook "${knob#comm-hook-}") ;;
            no-overlap) flags=(--no-overlap) ;;
            nccl-simple) flags=(); nccl=(NCCL_PROTO=Simple) ;;
            sum-bucket-view) flags=(--comm-hook sum --bucket-view) ;;
          esac
          run_two --loss padded --run-name "two-padded-$knob" --scaling-baseline "$sc/one-padded" "${flags[@]}"
        done
        nccl=()
        run_two --loss kernel --backend cuda --run-name two-kernel-sum-bucket-view \
          --scaling-baseline "$sc/one-kernel" --comm-hook sum --bucket-view
      } > "$out/scaling.log"
      python3 bench/scaling_table.py $sc/* > "$out/scaling.md" 2>&1
      tar czf "$out/scaling.tgz" "$sc"/*/summary.json 2>/dev/null
      cat "$out/scaling.md" ;;
    *) echo "unknown stage $stage: see the list at the top" >&2; exit 2 ;;
  esac
done
stamp "done"
