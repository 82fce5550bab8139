"""make compare: every strategy, both modes, on the same seed and batches, side by side.

    python3 -m studies.compare [train.py options...]      # run everything, compare
    python3 -m studies.compare --runs DIR [DIR ...]        # rebuild from finished runs

Each run is `train.run` in this process, into profiles/compare-<UTC time>/; every figure
of the comparison comes from the runs' summary.json files and names its folder. Under
torchrun every rank makes the same runs and rank 0 writes the comparison. The design in
full: docs/design.md, this module's section."""

import argparse
import json
import sys
import time
from pathlib import Path

import train
from core.commands import command, run_command
from core.errors import UserError
from core.files import write_whole
from core.names import MODES, describe, parse_variants, variants
from core.run_folder import display
from core.tables import csv_text, markdown_of_dicts
from kernels.giou.cuda_extension import unavailable_reason
from studies.charts import compare_chart, where_of
from studies.common import (
    SKIPPED,
    attempt,
    base_config,
    folder_name,
    fresh_out,
    keep_interrupted,
    progress,
    ranks_out,
    run_config,
    tables_follow,
    write_page,
)
from studies.compare_rows import (
    check_distinct,
    compare_rows,
    load_summary,
    present_columns,
    skipped_row,
    unlike_warning,
)
from training.ranks import from_env, stop

# The loop runs seconds per step at batch 1024 and its trace holds ~10^5 events a step.
LOOP_STEPS = {"warmup": 1, "active": 2}
# train.py options that make compare sets per run.
PER_RUN = ("loss", "backend", "mode", "run_name", "out_dir")
REFUSAL = ("is set per run by make compare (every run would be the same); choose runs "
           "with --strategies and --modes, and the folder with --out")


def loop_steps(given: dict) -> dict:
    """The loop's fewer steps, where the user's options do not set them."""
    return {name: n for name, n in LOOP_STEPS.items() if name not in given}


def run_all(out: Path, base: train.Config, given: dict, plan, runs: list, skipped: list
            ) -> None:
    """Runs the plan's (strategy, mode) pairs; appends the run folders to `runs` and the
    skipped rows (those that could not run here, and those that failed) to `skipped` as
    they end, so that an interrupted comparison keeps what finished."""
    cuda_reason = unavailable_reason()
    started = time.time()
    say = print if from_env().main else (lambda *a, **k: None)
    say(f"make compare: {len(plan)} runs, each a profiled train.py run (the loop's take "
        "longest)", flush=True)
    for i, ((loss, backend), mode) in enumerate(plan, 1):
        name = describe(loss, backend)
        tag = f"[{i}/{len(plan)}] {name} {mode}"
        if backend == "cuda" and cuda_reason:
            say(f"{tag}: skipped ({cuda_reason})", flush=True)
            skipped.append(skipped_row(name, mode, cuda_reason))
            continue
        cfg = run_config(base, loss=loss, backend=backend, mode=mode, out_dir=str(out),
                         run_name=f"{folder_name(loss, backend)}-{mode}",
                         **(loop_steps(given) if loss == "loop" else {}))
        say(progress(tag, started, i - 1, len(plan)), flush=True)
        record, reason = attempt(cfg, tag)
        if record is None:
            skipped.append(skipped_row(name, mode, reason))
            continue
        runs.append(Path(record["run_dir"]))
    say(f"all runs done in {time.time() - started:.0f} s", flush=True)


def write_comparison(out: Path, runs: list[Path], skipped: list[dict], note: str = "") -> str:
    """comparison.md, .csv, .png and the TensorBoard table; `note` opens the table."""
    summaries = [load_summary(r) for r in runs]
    rows = compare_rows(summaries)
    for row, run in zip(rows, runs):
        row["run folder"] = display(Path(run).absolute())
    rows += skipped
    rows.sort(key=lambda r: (MODES.index(r["mode"]), r["strategy"]))
    columns = present_columns(rows)
    table = markdown_of_dicts(columns, rows, left={"strategy", "mode"})
    warning = unlike_warning(summaries)
    if warning:
        print(warning, file=sys.stderr)
        table = f"{warning}\n\n{table}"
    if note:
        table = f"{note}\n\n{table}"
    write_whole(out / "comparison.md", table + "\n")
    write_whole(out / "comparison.csv", csv_text(columns, rows))
    compare_chart(rows, out / "comparison.png",
                  where_of(s.get("environment") for s in summaries))
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


def _keep_partial(out: Path, runs: list, skipped: list, planned: int, exc):
    """The comparison of the runs that finished before Ctrl-C or SIGTERM, opened by a line
    saying so, in <out>-interrupted/ (studies/common.keep_interrupted); the error to
    raise."""
    ended = len(runs) + len(skipped)

    def write_partial(folder: Path):
        write_whole(folder / SKIPPED, json.dumps(skipped, indent=1) + "\n")
        note = (f"**Interrupted** after {ended} of {planned} runs: the rows below are "
                "those that ended.")
        write_comparison(folder, [folder / r.name for r in runs], skipped, note=note)
    return keep_interrupted(out, exc, f"{len(runs)} of {planned} runs finished",
                            write_partial if runs else None)


def finished_runs(paths: list[Path]) -> tuple[list[Path], list[dict]]:
    """The runs to rebuild from, each complete, and the skipped rows recorded beside them
    for the same modes (a run that ended early is refused, never taken for complete)."""
    modes, summaries = set(), []
    for path in paths:
        if not (path / "summary.json").exists():
            raise UserError(f"no summary.json in {path}")
        summary = load_summary(path, "--runs")
        if summary.get("status", "complete") != "complete":
            raise UserError(f"{path} holds a run that {summary['status']} "
                            f"({summary.get('reason', '')}); leave it out of --runs")
        try:
            compare_rows([summary])  # a row of its own: every field the table reads
        except (KeyError, TypeError, AttributeError, IndexError) as exc:
            raise UserError(f"--runs: {path / 'summary.json'} is not a complete run's "
                            f"summary ({type(exc).__name__}: {exc})") from None
        modes.add(summary["config"]["mode"])
        summaries.append(summary)
    check_distinct(summaries, paths)
    skipped = []
    for parent in sorted({p.resolve().parent for p in paths}):
        if (parent / SKIPPED).exists():
            skipped += [r for r in json.loads((parent / SKIPPED).read_text())
                        if r["mode"] in modes]
    return paths, skipped


def _parse(argv) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(
        prog="make compare", allow_abbrev=False,
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
        description=__doc__.split("\n\n")[0],
        epilog="Every other option goes to each run: python3 train.py --help lists them.")
    parser.add_argument("--runs", nargs="+", type=Path, default=argparse.SUPPRESS,
                        help="rebuild the comparison from these run folders; runs nothing")
    parser.add_argument("--out", type=Path, default=argparse.SUPPRESS,
                        help="a new folder for the comparison (default: "
                        "profiles/compare-<time>/)")
    parser.add_argument("--strategies", default=",".join(variants()),
                        help="comma-separated, <loss>[:<kernel backend>]")
    parser.add_argument("--modes", default=",".join(MODES),
                        help="comma-separated: train (the whole step), forward (the "
                        "original's measurement)")
    args, rest = parser.parse_known_args(argv)
    for name in ("runs", "out"):  # SUPPRESSed defaults: their help says what none means
        setattr(args, name, getattr(args, name, None))
    return args, rest


def _main(argv) -> int:
    args, train_args = _parse(argv)
    plan_strategies, modes = parse_variants(args.strategies), args.modes.split(",")
    if not set(modes) <= set(MODES):
        raise UserError(f"--modes takes {', '.join(MODES)}")
    if args.runs:
        if train_args:
            raise UserError(f"--runs rebuilds from finished runs; {' '.join(train_args)} "
                            "would change nothing")
        runs, skipped = finished_runs(args.runs)
        out = fresh_out(args.out, "comparison", "compare")
        tables_follow()
    else:
        ranks = from_env()
        base, given = base_config(train_args, PER_RUN, REFUSAL)
        train.validate(base, ranks.world)  # the shared options, once before any run
        out = ranks_out(ranks, args.out, "comparison", "compare")
        plan = [(s, m) for m in modes for s in plan_strategies]
        runs, skipped = [], []
        try:
            run_all(out, base, given, plan, runs, skipped)
        except KeyboardInterrupt as exc:
            if not ranks.main:
                raise  # rank 0 keeps the comparison's folder
            raise _keep_partial(out, runs, skipped, len(plan), exc) from None
        stop()  # every rank done with the process group (train.main does the same)
        if not from_env().main:
            return 0  # rank 0 writes the comparison
        tables_follow()
        # Kept so that a rebuild from these run folders lists the skipped runs too.
        write_whole(out / SKIPPED, json.dumps(skipped, indent=1) + "\n")
    table = write_comparison(out, runs, skipped)
    print(table)
    print(f"written: {display(out / 'comparison.md')}, comparison.csv, comparison.png, "
          "comparison/")
    write_page(out, table)
    failed = [r for r in skipped if "the run failed" in str(r.get("profiled steps"))]
    if failed:
        print(f"error: {len(failed)} of {len(failed) + len(runs)} runs failed (their rows "
              "say why)", file=sys.stderr)
        return 1
    if not runs:
        print("error: no run could be made here (the rows say why)", file=sys.stderr)
        return 1
    return 0


main = command(_main)


if __name__ == "__main__":
    run_command(main, "the comparison was not written")
