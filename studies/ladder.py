"""make ladder: the train step's speed-ups added one at a time, each rung a profiled run.

    python3 -m studies.ladder [--strategies padded,kernel:cuda] [train.py options...]

Rung 0 is --baseline; rung k adds training.speedups.ORDER's k-th speed-up to rung k-1, on
the same seed. Writes ladder.md, ladder.csv, ladder-kernels.md and ladder.png under
profiles/ladder-<UTC time>/; a speed-up that cannot run here is a row that says why. The
design in full: docs/design.md, this module's section."""

import argparse
import json
import signal
import subprocess
import sys
import time
from pathlib import Path

import torch

import train
from core.commands import command, run_command
from core.errors import RunInterrupted, interruption
from core.files import write_whole
from core.names import PHASES, describe, parse_variants
from core.run_folder import display
from core.tables import csv_text, markdown_of_dicts
from kernels.giou.cuda_extension import unavailable_reason
from profiling import flops
from profiling.trace_summary import step_device_ms
from studies.charts import ladder_chart, where_of
from studies.common import (
    SKIPPED,
    attempt,
    base_config,
    folder_name,
    fresh_out,
    keep_interrupted,
    outcome,
    progress,
    run_config,
    tables_follow,
    write_page,
)
from studies.compare_rows import load_summary, ran_on_gpu
from training.speedups import BY_NAME, maths_changed
from training.speedups import ORDER as SPEEDUPS

GOAL_MS = 30.0  # the step's goal on the H100, drawn on the chart
# Set per rung: given in ARGS they would make the rungs the same.
PER_RUN = ("loss", "backend", "mode", "run_name", "out_dir", "baseline", *SPEEDUPS)
REFUSAL = "is set per rung by make ladder; choose strategies with --strategies"
COLUMNS = (["strategy", "rung", "maths", "step GPU ms", "step CPU ms", "saved GPU ms",
            *flops.COLUMNS]
           + [f"{p} GPU ms" for p in PHASES]
           + ["launches", "peak GPU GB", "first losses", "run folder"])


def rung_fields(speedup: str) -> dict:
    """The Config field that turns one speed-up on."""
    return {speedup: "on" if BY_NAME[speedup].choice else True}


# Triton's interpreter runs the two blocks at ~105 s a step at the CPU preset (batch 32 of
# 64x64 images) on 2 cores, in proportion to the pixels; on a CPU their rungs run only at
# sizes that take seconds.
INTERPRETER_S_PER_PIXEL = 105 / (32 * 64 * 64)
INTERPRETER_MAX_S = 10


def interpreter_seconds_per_step(cfg) -> float:
    """About how long Triton's interpreter takes for the two blocks in one step."""
    return INTERPRETER_S_PER_PIXEL * cfg.batch_size * cfg.image_size ** 2


def why_not_here(speedup: str, base: train.Config, loss: str, cuda: bool) -> str | None:
    """Why a speed-up cannot be added for this strategy on this machine, or None."""
    spec = BY_NAME[speedup]
    if spec.gpu_only and not cuda:
        return "needs a CUDA GPU"
    if spec.interpreter_slow and not cuda:
        seconds = interpreter_seconds_per_step(base)
        if seconds > INTERPRETER_MAX_S:
            return (f"Triton's interpreter would take ~{seconds:.0f} s a step here (batch "
                    f"{base.batch_size}, {base.image_size}x{base.image_size} images); it "
                    "runs on a GPU")
    return spec.why_not(train.asked_of(run_config(base, loss=loss)), cuda)


# cuDNN keeps, per process, the algorithm it first chose for a convolution's shapes and
# layout, whatever torch.backends.cudnn.benchmark says later: a benchmarked rung after a
# baseline in one process would measure the baseline's choices. So the rungs run in two
# processes: the baselines (heuristics) in one, every rung with cudnn_benchmark in another.
GROUPS = {"heuristics": ("baseline",), "tuned": SPEEDUPS}


def run_ladder(out: Path, train_args: list[str], plan_strategies, runs: dict, skipped: list,
               rungs=("baseline", *SPEEDUPS)) -> None:
    """Runs the given rungs of every strategy, each rung adding its speed-up to every
    speed-up before it; fills `runs` (run folders by (strategy, rung)) and `skipped` (rows
    of rungs that could not run) as each rung ends, so an interrupt keeps what finished."""
    cuda = torch.cuda.is_available()
    base, _ = base_config(train_args, PER_RUN, REFUSAL, baseline=True)
    started = time.time()
    total, done = len(plan_strategies) * len(rungs), 0  # for the estimate of the time left
    for loss, backend in plan_strategies:
        name = describe(loss, backend)
        fields = {}  # the speed-ups of the rungs so far
        for number, rung in enumerate(("baseline", *SPEEDUPS)):
            if rung not in rungs:
                if rung != "baseline" and not why_not_here(rung, run_config(base, **fields),
                                                           loss, cuda):
                    fields.update(rung_fields(rung))  # the rungs below this one stay on
                continue
            tag = f"[{name} {number}/{len(SPEEDUPS)}] {rung}"
            reason = unavailable_reason() if backend == "cuda" else None
            if reason is None and rung != "baseline":
                # With the rungs below on: a rung's refusal may depend on them.
                reason = why_not_here(rung, run_config(base, **fields), loss, cuda)
            if reason:
                print(f"{tag}: skipped ({reason})", flush=True)
                skipped.append({"strategy": name, "rung": _rung_name(rung),
                                "step GPU ms": f"skipped: {reason}"})
                continue
            if rung != "baseline":
                fields.update(rung_fields(rung))
            cfg = run_config(base, loss=loss, backend=backend, mode="train", out_dir=str(out),
                             run_name=f"{folder_name(loss, backend)}-{number}-{rung}",
                             **fields)
            print(progress(tag, started, done, total), flush=True)
            record, reason = attempt(cfg, tag)
            done += 1
            if record is None:
                skipped.append({"strategy": name, "rung": _rung_name(rung),
                                "step GPU ms": reason})
                continue
            runs[(name, _rung_name(rung))] = Path(record["run_dir"])


def _run_group(argv: list[str]) -> int:
    """A group's process, to its end. Ctrl-C or SIGTERM to this process alone is passed on
    to it as Ctrl-C, and its rung is left to mark its own folder: subprocess.call would
    kill it (SIGKILL, its folder unmarked), and this process dying first orphaned it."""
    proc = subprocess.Popen(argv)
    try:
        return proc.wait()
    except KeyboardInterrupt:
        proc.send_signal(signal.SIGINT)  # a second one, after the group's own, is dropped
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        raise


def run_groups(out: Path, train_args: list[str], text: str, plan_strategies, runs: dict,
               skipped: list) -> None:
    """Every rung, each group of GROUPS in a process of its own (this module's --group);
    fills `runs` and `skipped` as run_ladder does, over all groups, in ladder order. A
    group ended by Ctrl-C or SIGTERM (to it or to this process) is a KeyboardInterrupt
    here, with the rungs that finished before it in `runs`."""
    started = time.time()
    names = [describe(*s) for s in plan_strategies]
    order = ["baseline", *(_rung_name(r) for r in SPEEDUPS)]
    for group in GROUPS:
        try:
            code = _run_group([sys.executable, "-m", "studies.ladder", "--group", group,
                               "--strategies", text, "--out", str(out), *train_args])
            interrupted = None if code != 130 else KeyboardInterrupt()
        except KeyboardInterrupt as exc:  # to this process: the group has ended too
            code, interrupted = 130, exc
        done = out / f"rungs-{group}.json"
        if done.exists():
            record = json.loads(done.read_text())
            runs.update({(s, r): Path(p) for s, r, p in record["runs"]})
            skipped += record["skipped"]
            ordered = sorted(runs.items(), key=lambda kv: (names.index(kv[0][0]),
                                                           order.index(kv[0][1])))
            runs.clear()
            runs.update(ordered)
        if interrupted is not None:
            # The group's line says at which step its rung was; the signal is the one
            # this process got where it got one (it passes any signal on as Ctrl-C).
            line = record.get("interrupted") if done.exists() else None
            if line and str(interrupted) and ")" in line:
                line = f"interrupted ({interrupted}){line[line.index(')') + 1:]}"
            raise RunInterrupted(line) if line else interrupted
        if code != 0 or not done.exists():
            skipped += [{"strategy": n, "rung": _rung_name(r),
                         "step GPU ms": f"the run failed: its process ended with exit {code}"}
                        for n in names for r in GROUPS[group]]
    print(f"all rungs done in {time.time() - started:.0f} s", flush=True)


def _rung_name(rung: str) -> str:
    return rung if rung == "baseline" else f"+ {rung}"


def ladder_rows(runs: dict, skipped: list[dict], summaries: dict) -> list[dict]:
    """One row per rung, in the order the runs were made, skipped ones where they fell
    (summaries: each run's summary.json, by the same key as runs)."""
    rows, previous = [], {}
    for (strategy, rung), s in summaries.items():
        on_gpu = ran_on_gpu(s)
        step_gpu = step_device_ms(s["step"]) if on_gpu else None
        row = {"strategy": strategy, "rung": rung,
               "maths": maths_changed((s.get("speedups") or {}).get("on", {})),
               "step GPU ms": step_gpu,
               "step CPU ms": s["step"]["cpu_ms"],
               "saved GPU ms": (previous[strategy] - step_gpu
                                if on_gpu and strategy in previous else None),
               **flops.cells(s.get("flops"))}
        for phase, p in s["phases"].items():
            row[f"{phase} GPU ms"] = p["gpu_ms"] if on_gpu else None
        row.update({
            "launches": sum(p["launches"] for p in s["phases"].values()) if on_gpu else None,
            "peak GPU GB": s.get("peak_gpu_memory_gb"),
            "first losses": " ".join(f"{v:.4f}" for v in s["losses"][:3]),
            "run folder": display(runs[(strategy, rung)].absolute()),
        })
        if on_gpu:
            previous[strategy] = step_gpu
        rows.append(row)
    rows += skipped
    rung_order = ["baseline", *(_rung_name(r) for r in SPEEDUPS)]
    strategy_order = list(dict.fromkeys(r["strategy"] for r in rows))
    rows.sort(key=lambda r: (strategy_order.index(r["strategy"]), rung_order.index(r["rung"])))
    return rows


def short_kernel_name(name: str, width: int = 150) -> str:
    """A kernel's name without the namespaces that every ATen kernel shares, cut to width:
    the template arguments that tell two multi_tensor_apply kernels apart stay."""
    for noise in ("void ", "at::native::", "(anonymous namespace)::", "at::"):
        name = name.replace(noise, "")
    return name if len(name) <= width else name[:width - 1] + "…"


def kernel_changes(runs: dict, limit: int = 6) -> str:
    """Per rung, the kernels whose GPU time per step changed most against the rung before
    (from each run's top kernels): which kernels a speed-up removed, shortened or added."""
    lines = ["# Where each speed-up's time went", "",
             "GPU ms per step of the kernels that changed most against the rung before "
             "(from each run's top kernels; a kernel outside a run's top list counts as 0).",
             ""]
    previous = {}
    for (strategy, rung), path in runs.items():
        kernels = {k["name"]: k["gpu_ms"] for k in load_summary(path).get("top_kernels", [])}
        before = previous.get(strategy)
        previous[strategy] = kernels
        if before is None or not (kernels or before):
            continue
        deltas = sorted(((kernels.get(n, 0.0) - before.get(n, 0.0), n)
                         for n in set(kernels) | set(before)), key=lambda d: -abs(d[0]))
        lines += [f"## {strategy} {rung}", "", "| change ms | before ms | after ms | kernel |",
                  "|---:|---:|---:|---|"]
        for delta, n in deltas[:limit]:
            lines.append(f"| {delta:+.3f} | {before.get(n, 0.0):.3f} | "
                         f"{kernels.get(n, 0.0):.3f} | `{short_kernel_name(n)}` |")
        lines.append("")
    return "\n".join(lines)


def write_ladder(out: Path, runs: dict, skipped: list[dict], note: str = "") -> str:
    """skipped.json, ladder.md, .csv, ladder-kernels.md and ladder.png; `note` opens the
    table."""
    write_whole(out / SKIPPED, json.dumps(skipped, indent=1) + "\n")
    # Read once: the rows and the chart's device and commit.
    summaries = {key: load_summary(path) for key, path in runs.items()}
    rows = ladder_rows(runs, skipped, summaries)
    columns = [c for c in COLUMNS if any(c in r for r in rows)]
    table = markdown_of_dicts(columns, rows, left={"strategy", "rung"})
    if note:
        table = f"{note}\n\n{table}"
    write_whole(out / "ladder.md", table + "\n")
    write_whole(out / "ladder.csv", csv_text(columns, rows))
    write_whole(out / "ladder-kernels.md", kernel_changes(runs))
    where = where_of(s.get("environment") for s in summaries.values())
    ladder_chart(rows, out / "ladder.png", where, GOAL_MS)
    return table


def _group(out: Path, group: str, train_args: list[str], plan_strategies) -> int:
    """A worker of run_groups: its rungs, into the ladder's folder, and rungs-<group>.json
    listing them. Ctrl-C or SIGTERM: the rungs that finished are listed all the same, with
    the line to print, and the process ends with 130 silently (make ladder prints it)."""
    runs, skipped, line = {}, [], None
    try:
        run_ladder(out, train_args, plan_strategies, runs, skipped, GROUPS[group])
    except KeyboardInterrupt as exc:
        line = interruption(exc)
    record = {"runs": [[s, r, str(p)] for (s, r), p in runs.items()], "skipped": skipped}
    if line:
        record["interrupted"] = line
    write_whole(out / f"rungs-{group}.json", json.dumps(record))
    return 130 if line else 0


def _keep_partial(out: Path, runs: dict, skipped: list, planned: int, exc):
    """The ladder of the rungs that finished before Ctrl-C or SIGTERM, opened by a line
    saying so, in <out>-interrupted/ (studies/common.keep_interrupted); the error to
    raise."""
    def write_partial(folder: Path):
        note = (f"**Interrupted** after {len(runs)} of {planned} rungs: the rows below "
                "are those that finished or were skipped.")
        write_ladder(folder, {k: folder / p.name for k, p in runs.items()}, skipped, note=note)
    return keep_interrupted(out, exc, f"{len(runs)} of {planned} rungs finished",
                            write_partial if runs else None)


def _main(argv) -> int:
    parser = argparse.ArgumentParser(prog="make ladder", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default="padded,kernel:cuda",
                        help="comma-separated, <loss>[:<kernel backend>]")
    parser.add_argument("--out", type=Path, help="a new folder for the ladder "
                        "(default: profiles/ladder-<time>/)")
    parser.add_argument("--group", choices=tuple(GROUPS), help=argparse.SUPPRESS)
    args, train_args = parser.parse_known_args(argv)
    # make ladder passes LADDER= as --strategies: the user typed one or the other.
    plan_strategies = parse_variants(args.strategies, "--strategies (make: LADDER=)")
    if args.group:
        return _group(args.out, args.group, train_args, plan_strategies)
    base, _ = base_config(train_args, PER_RUN, REFUSAL, baseline=True)
    train.validate(base)
    out = fresh_out(args.out, "ladder", "ladder")
    planned = len(plan_strategies) * (1 + len(SPEEDUPS))
    print(f"make ladder: {len(plan_strategies)} strategies x {1 + len(SPEEDUPS)} rungs, each "
          "a profiled train.py run, in two processes", flush=True)
    runs, skipped = {}, []
    try:
        run_groups(out, train_args, args.strategies, plan_strategies, runs, skipped)
    except KeyboardInterrupt as exc:
        raise _keep_partial(out, runs, skipped, planned, exc) from None
    tables_follow()
    table = write_ladder(out, runs, skipped)
    print(table)
    print(f"written: {display(out / 'ladder.md')}, ladder.csv, ladder-kernels.md, ladder.png")
    write_page(out, table)
    return outcome(skipped, "step GPU ms", len(runs), "rungs")


main = command(_main)


if __name__ == "__main__":
    run_command(main, "the ladder was not written")
