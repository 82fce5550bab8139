"""make compare: every strategy, both modes, on the same seed and batches, side by side.

    python3 -m profiling.run_comparison [train.py options...]      # run everything, compare
    python3 -m profiling.run_comparison --runs DIR [DIR ...]        # rebuild from finished runs

Each run is `train.run` in this process (the model is built and compiled once and
re-initialised per run), writing into profiles/compare-<UTC time>/<strategy>-<mode>/; the
comparison (comparison.md, comparison.csv, comparison.png, and a TensorBoard text table
and scalars under comparison/) is written beside them. Every figure comes from the runs'
summary.json files, and every row names the folder it came from. The loop strategy gets 1
warmup and 2 profiled steps (seconds per step at batch 1024); the table's 'profiled steps'
column says so. Where the CUDA kernel backend cannot run (no GPU or no nvcc), its rows say
why. A comparison never overwrites another: each goes into a new folder.

Under torchrun (make compare GPUS=N, training/launch.py) every rank makes the same runs,
each a job of N ranks (train.py's), and rank 0 alone prints and writes the comparison. A
run that fails on a rank ends the whole job there: the ranks must make their runs in
step.
"""

import argparse
import json
import sys
import time
import traceback
from pathlib import Path

import train
from core.names import BACKENDS, MODES, STRATEGIES, describe, variants
from errors import UserError, exit_with, one_line
from profiling.chart import loss_chart
from profiling.compare import compare_rows, load_summary, skipped_row, to_csv, to_markdown
from profiling.harness import USER_ERRORS
from profiling.run_folder import check_out_dir, display, new_run_dir, utc_stamp
from training.ranks import from_env, stop

# The loop runs seconds per step at batch 1024 and its trace holds ~10^5 events a step.
LOOP_STEPS = {"--warmup": 1, "--active": 2}
SKIPPED = "skipped.json"
# train.py options that make compare sets per run: given in ARGS they would make every run
# the same one.
PER_RUN_OPTIONS = ("--loss", "--backend", "--kernel", "--mode", "--run-name", "--out-dir")


class CompareError(Exception):
    """A mistake in make compare's options; the message is one line for the user."""


def loop_steps(train_args: list[str]) -> list[str]:
    """The loop's fewer steps, where the user's options do not set them."""
    return [str(a) for flag, n in LOOP_STEPS.items() if flag not in train_args
            for a in (flag, n)]


def _name(strategy: str, mode: str) -> str:
    return f"{strategy.replace(':', '-')}-{mode}"


def attempt(args: list[str], label: str) -> tuple[dict | None, str | None]:
    """One train.run in this process: (its summary, None), or (None, why it failed). One
    run's failure is a row of the table, not the end of it (on one rank)."""
    try:
        # In this process: the model, its compiled form and CUDA's start-up are shared
        # by every run (model/build.py re-initialises the weights for each).
        return train.run(train.parse_config(args), reuse=True), None
    except Exception as exc:
        if from_env().distributed:
            raise  # the other ranks would wait for this one in the next run's collectives
        if not isinstance(exc.__cause__ or exc, USER_ERRORS):
            traceback.print_exc()
        print(f"{label}: failed: {one_line(exc)}", file=sys.stderr, flush=True)
        return None, f"the run failed: {one_line(exc)}"


def run_all(out: Path, train_args: list[str], strategies=variants(),
            modes=MODES) -> tuple[list[Path], list[dict]]:
    """Runs the strategies in the modes; returns the run folders and the skipped rows
    (those that could not run here, and those that failed)."""
    from kernels.cuda_giou import unavailable_reason
    cuda_reason = unavailable_reason()
    plan = [(s, m) for m in modes for s in strategies]
    runs, skipped, started = [], [], time.time()
    say = print if from_env().main else (lambda *a, **k: None)
    for i, (strategy, mode) in enumerate(plan, 1):
        loss, _, backend = strategy.partition(":")
        label = f"[{i}/{len(plan)}] {strategy} {mode}"
        if backend == "cuda" and cuda_reason:
            say(f"{label}: skipped ({cuda_reason})", flush=True)
            skipped.append(skipped_row(describe(loss, "cuda"), mode, cuda_reason))
            continue
        extra = loop_steps(train_args) if loss == "loop" else []
        args = ["--loss", loss, "--backend", backend or BACKENDS[0], "--mode", mode,
                "--out-dir", str(out), "--run-name", _name(strategy, mode), *extra,
                *train_args]
        say(f"{label} ({time.time() - started:.0f} s so far)", flush=True)
        record, reason = attempt(args, label)
        if record is None:
            skipped.append(skipped_row(describe(loss, backend or BACKENDS[0]), mode, reason))
            continue
        runs.append(Path(record["run_dir"]))
    say(f"all runs done in {time.time() - started:.0f} s", flush=True)
    return runs, skipped


def write_comparison(out: Path, runs: list[Path], skipped: list[dict]) -> str:
    summaries = [load_summary(r) for r in runs]
    rows = compare_rows(summaries)
    for row, run in zip(rows, runs):
        row["run folder"] = display(Path(run).absolute())
    rows += skipped
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


def _check_strategies(strategies: list[str]) -> None:
    for s in strategies:
        loss, _, backend = s.partition(":")
        if loss not in STRATEGIES or backend not in ("", *BACKENDS):
            raise CompareError(f"unknown strategy {s!r} in --strategies: use "
                               f"<loss>[:{'|:'.join(BACKENDS)}] with a loss from "
                               f"{', '.join(STRATEGIES)}")


def _check_train_args(train_args: list[str]) -> None:
    for arg in train_args:
        flag = arg.split("=", 1)[0]
        if flag in PER_RUN_OPTIONS:
            raise CompareError(f"{flag} is set per run by make compare (every run would be "
                               "the same); choose runs with --strategies and --modes, and "
                               "the folder with --out")
    try:  # the shared train.py options, checked once before any run starts
        train.validate(train.parse_config(train_args), from_env().world)
    except UserError as exc:
        raise CompareError(one_line(exc)) from None


def _fresh_out(out: Path | None, kind: str = "comparison", prefix: str = "compare") -> Path:
    """The output folder: a new one, or --out if it holds no <kind> yet."""
    if out is None:
        return new_run_dir(check_out_dir("profiles"), f"{prefix}-{utc_stamp()}")
    check_out_dir(str(out))
    if (out / f"{kind}.md").exists() or (out / SKIPPED).exists():
        raise CompareError(f"{out} already holds a {kind}; choose a new --out (a "
                           f"{kind} is never overwritten)")
    out.mkdir(parents=True, exist_ok=True)
    return out


def _finished_runs(paths: list[Path]) -> tuple[list[Path], list[dict]]:
    """The runs to rebuild from, each complete, and the skipped rows recorded beside them
    for the same modes (a run that ended early is refused, never taken for complete)."""
    modes = set()
    for path in paths:
        if not (path / "summary.json").exists():
            raise CompareError(f"no summary.json in {path}")
        summary = load_summary(path)
        if summary.get("status", "complete") != "complete":
            raise CompareError(f"{path} holds a run that {summary['status']} "
                               f"({summary.get('reason', '')}); leave it out of --runs")
        modes.add(summary["config"]["mode"])
    skipped = []
    for parent in sorted({p.resolve().parent for p in paths}):
        if (parent / SKIPPED).exists():
            skipped += [r for r in json.loads((parent / SKIPPED).read_text())
                        if r["mode"] in modes]
    return paths, skipped


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--runs", nargs="+", type=Path,
                        help="rebuild the comparison from these run folders; runs nothing")
    parser.add_argument("--out", type=Path, help="a new folder for the comparison "
                        "(default: profiles/compare-<time>/)")
    parser.add_argument("--strategies", default=",".join(variants()),
                        help="comma-separated, <loss>[:<kernel backend>]")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated")
    args, train_args = parser.parse_known_args(argv)
    strategies, modes = args.strategies.split(","), args.modes.split(",")
    try:
        _check_strategies(strategies)
        if not set(modes) <= set(MODES):
            raise CompareError(f"--modes takes {', '.join(MODES)}")
        if args.runs:
            if train_args:
                raise CompareError(f"--runs rebuilds from finished runs; "
                                   f"{' '.join(train_args)} would change nothing")
            runs, skipped = _finished_runs(args.runs)
            out = _fresh_out(args.out)
        else:
            _check_train_args(train_args)
            ranks = from_env()
            if ranks.distributed:
                import torch
                ranks.start(torch.cuda.is_available())
            # Rank 0 makes the folder; the others are told its name.
            out = ranks.share(_fresh_out(args.out) if ranks.main else None)
    except (CompareError, UserError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    if not args.runs:
        runs, skipped = run_all(out, train_args, strategies, modes)
        stop()  # every rank done with the process group (train.main does the same)
        if not from_env().main:
            return 0  # rank 0 writes the comparison
        # Kept so that a rebuild from these run folders lists the skipped runs too.
        (out / SKIPPED).write_text(json.dumps(skipped, indent=1) + "\n")
    print(write_comparison(out, runs, skipped))
    print(f"written: {display(out / 'comparison.md')}, comparison.csv, comparison.png, "
          "comparison/")
    failed = [r for r in skipped if "the run failed" in str(r.get("profiled steps"))]
    if failed:
        print(f"error: {len(failed)} of {len(failed) + len(runs)} runs failed (their rows "
              "say why)", file=sys.stderr)
        return 1
    if not runs:
        print("error: no run could be made here (the rows say why)", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    exit_with(main, "the comparison was not written")
