"""make compare: every strategy, both modes, on the same seed and batches, side by side.

    python3 -m profiling.run_comparison [train.py options...]      # run everything, compare
    python3 -m profiling.run_comparison --runs DIR [DIR ...]        # rebuild from finished runs

Each run is `train.run` in this process (the model is built and compiled once and
re-initialised per run), writing into profiles/compare-<UTC time>/<strategy>-<mode>/; the
comparison (comparison.md, comparison.csv, comparison.png, and a TensorBoard text table
and scalars under comparison/) is written beside them. Every figure comes from the runs'
summary.json files. The loop strategy gets 1 warmup and 2 profiled steps (seconds per step
at batch 1024); the table's 'profiled steps' column says so. Where the CUDA kernel backend cannot
run (no GPU or no nvcc), its rows say why.
"""

import argparse
import json
import os
import sys
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path

import train
from errors import UserError, one_line
from profiling.chart import loss_chart
from profiling.compare import compare_rows, load_summary, skipped_row, to_csv, to_markdown

REPO = train.REPO
STRATEGIES = ("loop", "concat", "padded", "compiled", "kernel:triton", "conditional:triton",
              "kernel:cuda", "conditional:cuda")
MODES = ("forward", "train")
# The loop runs seconds per step at batch 1024 and its trace holds ~10^5 events a step.
LOOP_STEPS = {"--warmup": 1, "--active": 2}
SKIPPED = "skipped.json"


def loop_steps(train_args: list[str]) -> list[str]:
    """The loop's fewer steps, where the user's options do not set them."""
    return [str(a) for flag, n in LOOP_STEPS.items() if flag not in train_args
            for a in (flag, n)]


def _name(strategy: str, mode: str) -> str:
    return f"{strategy.replace(':', '-')}-{mode}"


def run_all(out: Path, train_args: list[str], strategies=STRATEGIES,
            modes=MODES) -> tuple[list[Path], list[dict]]:
    """Runs the strategies in the modes; returns the run folders and the skipped rows."""
    from kernels.cuda_giou import unavailable_reason
    cuda_reason = unavailable_reason()
    plan = [(s, m) for m in modes for s in strategies]
    runs, skipped, started = [], [], time.time()
    for i, (strategy, mode) in enumerate(plan, 1):
        loss, _, kernel = strategy.partition(":")
        label = f"[{i}/{len(plan)}] {strategy} {mode}"
        if kernel == "cuda" and cuda_reason:
            print(f"{label}: skipped ({cuda_reason})", flush=True)
            skipped.append(skipped_row(f"{loss}/cuda", mode, cuda_reason))
            continue
        extra = loop_steps(train_args) if loss == "loop" else []
        name = _name(strategy, mode)
        args = ["--loss", loss, "--kernel", kernel or "triton", "--mode", mode,
                "--out-dir", str(out), "--run-name", name, *extra, *train_args]
        print(f"{label} ({time.time() - started:.0f} s so far)", flush=True)
        try:
            # In this process: the model, its compiled form and CUDA's start-up are shared
            # by every run (train.build_model re-initialises the weights for each).
            record = train.run(train.parse_config(args), reuse=True)
        except Exception as exc:  # one run's failure is a row, not the end of the table
            if not isinstance(exc, UserError):
                traceback.print_exc()
            print(f"{label}: failed: {one_line(exc)}", file=sys.stderr, flush=True)
            skipped.append(skipped_row(strategy.replace(":", "/"), mode,
                                       f"the run failed: {one_line(exc)}"))
            continue
        runs.append(Path(record["run_dir"]))
    print(f"all runs done in {time.time() - started:.0f} s", flush=True)
    return runs, skipped


def _load_skipped(out: Path) -> list[dict]:
    return json.loads((out / SKIPPED).read_text()) if (out / SKIPPED).exists() else []


def write_comparison(out: Path, runs: list[Path], skipped: list[dict]) -> str:
    rows = compare_rows([load_summary(r) for r in runs]) + skipped
    rows.sort(key=lambda r: (MODES.index(r["mode"]), r["strategy"]))
    table = to_markdown(rows)
    (out / "comparison.md").write_text(table + "\n")
    (out / "comparison.csv").write_text(to_csv(rows))
    loss_chart(rows, out / "comparison.png")
    from torch.utils.tensorboard import SummaryWriter
    with SummaryWriter(str(out / "comparison")) as writer:
        writer.add_text("comparison", table, 0)
        for r in rows:
            tag = r["strategy"].replace("/", "_")
            for column in ("loss CPU ms", "loss GPU ms", "step CPU ms", "step GPU ms"):
                if r.get(column) is not None:  # absent for skipped runs, GPU ones on a CPU
                    name = column.replace(" ", "_").lower()
                    writer.add_scalar(f"{r['mode']}/{name}/{tag}", r[column], 0)
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", nargs="+", type=Path,
                        help="rebuild the comparison from these run folders; runs nothing")
    parser.add_argument("--out", type=Path, help="where the comparison goes (default: a new "
                        "profiles/compare-<time>/, or the runs' common folder with --runs)")
    parser.add_argument("--strategies", default=",".join(STRATEGIES),
                        help="comma-separated, <loss>[:<kernel backend>]")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    args, train_args = parser.parse_known_args(argv)
    strategies, modes = args.strategies.split(","), args.modes.split(",")
    import losses
    from kernels import BACKENDS
    for s in strategies:
        if s.partition(":")[0] not in losses.NAMES or s.partition(":")[2] not in ("", *BACKENDS):
            print(f"error: unknown strategy {s!r} in --strategies: use <loss>[:triton|:cuda] "
                  f"with a loss from {', '.join(losses.NAMES)}", file=sys.stderr)
            return 2
    if not set(modes) <= set(MODES):
        print(f"error: --modes takes {', '.join(MODES)}", file=sys.stderr)
        return 2
    if args.runs:
        missing = [str(r) for r in args.runs if not (r / "summary.json").exists()]
        if missing:
            print(f"error: no summary.json in {', '.join(missing)}", file=sys.stderr)
            return 2
        out = args.out or Path(os.path.commonpath([r.resolve().parent for r in args.runs]))
        runs = args.runs
        skipped = _load_skipped(out)
    else:
        try:  # the shared train.py options, checked once before any run starts
            train.validate(train.parse_config(train_args))
        except UserError as exc:
            print(f"error: {one_line(exc)}", file=sys.stderr)
            return 2
        stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
        # A named --out may already hold runs (a comparison made in stages); train.py
        # never overwrites a run folder, it adds a suffix.
        out = args.out or REPO / "profiles" / f"compare-{stamp}"
        out.mkdir(parents=True, exist_ok=args.out is not None)
        runs, skipped = run_all(out, train_args, strategies, modes)
        # Kept so that a rebuild from the run folders lists the skipped runs too.
        (out / SKIPPED).write_text(json.dumps(_load_skipped(out) + skipped, indent=1) + "\n")
    print(write_comparison(out, runs, skipped))
    print(f"written: {out / 'comparison.md'}, comparison.csv, comparison.png, comparison/")
    return 0


if __name__ == "__main__":
    sys.exit(main())
