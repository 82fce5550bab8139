"""make throughput: what each strategy sustains over a long run, against the GPU's own rate.

    python3 -m studies.throughput [--strategies padded,kernel:triton] [train.py options...]

Each strategy runs a whole epoch in train mode (the ragged ones a time budget), its
profiled window at the end. The sustained rate is the global batch over the summed device
step times after --settle; the GPU's own rate is the batch over the profiled steps' GPU
busy time. The table, column by column: docs/runs.md; the design in full: docs/design.md,
this module's section."""

import argparse
import csv
import dataclasses
import json
import math
import time
from pathlib import Path

import train
from core.commands import command, run_command
from core.errors import UserError
from core.files import read_json_object, write_whole
from core.names import RAGGED, describe, parse_variants, variants
from core.run_folder import display
from core.tables import csv_text, markdown_of_dicts
from kernels.giou.cuda_extension import unavailable_reason
from profiling.environment import environment
from profiling.gpu_clocks import held_under_load
from profiling.trace_summary import step_device_ms
from studies.charts import step_times_chart, throughput_chart, where_of
from studies.common import (
    PACE_COLUMNS,
    SKIPPED,
    attempt,
    base_config,
    discard_out,
    folder_name,
    keep_interrupted,
    outcome,
    pace_cells,
    progress,
    ranks_out,
    run_config,
    tables_follow,
    write_page,
)
from studies.compare_rows import load_summary
from training.ranks import from_env, stop

PER_RUN = ("loss", "backend", "mode", "run_name", "out_dir")
REFUSAL = ("is set per run by make throughput; choose runs with --strategies and the "
           "folder with --out")
COLUMNS = ["strategy", "steps run", "sustained samples/s", "GPU's rate samples/s", "share",
           "TFLOP/s a GPU", "MFU %", "step median ms", "step p95 ms", "GPU busy", "SM MHz",
           "power W", "clock held by", "J a step", "data wait ms", "steps waited",
           *PACE_COLUMNS, "timer", "budget", "loader", "copy", "run folder"]
# With --against: each strategy's sustained rate over its rate in the other table.
SCALING = "scaling"


# The CPU preset's epoch is 31,250 steps of batch 32 (hours on 2 cores): its runs stop
# here unless --steps says, their window at the start, where a Ctrl-C still keeps it.
CPU_STEPS = 60


def epoch_steps(base: train.Config, world: int = 1) -> int:
    """An epoch's steps: the dataset over the global batch (each rank takes its share)."""
    return base.dataset_length // (base.batch_size * world)


def cpu_capped(base: train.Config, given: dict, world: int = 1) -> bool:
    """Whether this is a CPU run whose epoch is cut to CPU_STEPS."""
    return (base.preset == "cpu" and "steps" not in given
            and epoch_steps(base, world) > CPU_STEPS)


def run_fields(base: train.Config, given: dict, loss: str, ragged_seconds: float,
               world: int = 1) -> dict:
    """One run's steps, window and budget, where the user's options do not set them: an
    epoch with the window at its end; for a ragged strategy a time budget, the window at
    its start. On a CPU, an epoch over CPU_STEPS is cut to CPU_STEPS, its window where
    --wait puts it (the start), and no budget."""
    window = base.wait + base.warmup + base.active
    if cpu_capped(base, given, world):
        return {"steps": max(CPU_STEPS, window)}
    steps = max(base.steps, window) if "steps" in given else epoch_steps(base, world)
    fields = {"steps": steps}
    if loss in RAGGED:  # its window stays where --wait puts it, before the budget ends
        fields["seconds"] = ragged_seconds
    else:
        fields["wait"] = steps - base.warmup - base.active
    return {k: v for k, v in fields.items() if k not in given}


def check_epoch(base: train.Config, given: dict, world: int = 1) -> None:
    """An epoch (the runs' length unless --steps says) must hold the profiled window: a
    short --dataset-length made the window's --wait negative, and the refusal named
    --wait, which the user never gave."""
    if "steps" in given or cpu_capped(base, given, world):
        return
    epoch = epoch_steps(base, world)
    window = base.warmup + base.active
    if epoch < window:
        ranks = f" x {world} ranks" if world > 1 else ""
        raise UserError(f"an epoch of --dataset-length {base.dataset_length} at batch "
                        f"{base.batch_size}{ranks} is {epoch} steps, too few for the profiled "
                        f"window at its end ({window} steps): give a larger "
                        "--dataset-length, or --steps")


def row_of(summary: dict, folder: Path) -> dict:
    rate, cfg = summary["sustained"] or {}, summary["config"]
    gpu_ms = step_device_ms(summary["step"], before="busiest_stream_ms")
    batch = cfg["batch_size"] * summary.get("distributed", {}).get("world", 1)
    own = batch / gpu_ms * 1e3 if gpu_ms else None
    busy = summary.get("gpu_busy_fraction")
    wait = summary.get("data_wait") or {}
    model = summary.get("flops") or {}
    sustained_mfu = model.get("sustained_mfu")
    return {
        "strategy": describe(cfg["loss"], cfg["backend"]), "steps run": summary["steps_run"],
        "sustained samples/s": rate.get("samples_per_s"), "GPU's rate samples/s": own,
        "share": (f"{rate['samples_per_s'] / own * 100:.1f} %" if own and rate else None),
        # The model's FLOPs at the sustained rate, a GPU's share (the run's own account:
        # profiling/harness.py, profiling/flops.py).
        "TFLOP/s a GPU": (model.get("sustained_tflop_per_s")
                          if sustained_mfu is not None else None),
        "MFU %": None if sustained_mfu is None else sustained_mfu * 100,
        "step median ms": rate.get("step_ms_median"), "step p95 ms": rate.get("step_ms_p95"),
        "GPU busy": None if busy is None else f"{busy * 100:.1f} %",
        **clock_cells(summary.get("gpu_clocks")),
        "data wait ms": wait.get("total_ms"), "steps waited": wait.get("steps_waited"),
        **pace_cells(summary),
        "timer": rate.get("timer"),
        "budget": f"{cfg['seconds']:g} s" if cfg.get("seconds") else None,
        # How the batches reached the step: what decides the share (docs/runs.md).
        "loader": (summary.get("batches") or {}).get("loader", cfg.get("loader")),
        "copy": (summary.get("batches") or {}).get("copy"),
        "run folder": display(folder.absolute())}


def clock_cells(clocks: dict | None) -> dict:
    """The SM clock and power medians over the sustained steps, and the reason that held
    the clock down in the most samples, with its share (idle is no reason under load);
    the joules a step, where NVML's counter gave them."""
    if not clocks:
        return {}
    joules = ({"J a step": round(clocks["joules_per_step"], 2)}
              if "joules_per_step" in clocks else {})
    if "unavailable" in clocks:
        return joules
    held = held_under_load(clocks)
    return {"SM MHz": round(clocks["sm_mhz_median"]), "power W": round(clocks["power_w_median"]),
            "clock held by": f"{held[0][0]} {held[0][1] * 100:.0f} %" if held else "nothing",
            **joules}


def _main(argv) -> int:
    parser = argparse.ArgumentParser(prog="make throughput", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--strategies", default=",".join(variants()),
                        help="comma-separated, <loss>[:<kernel backend>]")
    parser.add_argument("--ragged-seconds", type=float, default=30.0,
                        help="the time budget of loop and concat (seconds of steps)")
    parser.add_argument("--out", type=Path, help="a new folder (default: "
                        "profiles/throughput-<time>/)")
    parser.add_argument("--against", type=Path, help="another make throughput's folder "
                        "(one GPU's, say): each strategy's scaling against its rate there")
    args, train_args = parser.parse_known_args(argv)
    plan = parse_variants(args.strategies)
    if not (math.isfinite(args.ragged_seconds) and args.ragged_seconds > 0):
        raise UserError(f"--ragged-seconds must be a positive number of seconds, got "
                        f"{args.ragged_seconds}")
    against = rates_in(args.against) if args.against else None
    ranks = from_env()  # make throughput GPUS=N: every rank makes the same runs, in step
    base, given = base_config(train_args, PER_RUN, REFUSAL)
    check_epoch(base, given, ranks.world)
    if against is not None:
        check_against(args.against, against, base)
    padded = run_fields(base, given, "padded", args.ragged_seconds, ranks.world)
    train.validate(run_config(base, **padded), ranks.world)
    out = ranks_out(ranks, args.out, "throughput", "throughput")  # rank 0 writes the table
    say = print if ranks.main else (lambda *a, **k: None)
    steps = padded.get("steps", base.steps)
    on = f" on {ranks.world} ranks" if ranks.distributed else ""
    if cpu_capped(base, given, ranks.world):
        say(f"make throughput on a CPU{on}: {len(plan)} runs of {steps} steps each (an "
            f"epoch would be {epoch_steps(base, ranks.world):,} steps: --steps N for "
            "more), each window at its run's start; a CPU's rates say nothing of a GPU's",
            flush=True)
    else:
        say(f"make throughput{on}: {len(plan)} runs of {steps} steps each (loop and "
            f"concat: {args.ragged_seconds:g} s of steps)", flush=True)
    rows, skipped, runs = [], [], []
    try:
        _run_all(out, base, given, plan, args.ragged_seconds, rows, skipped, runs, say)
    except KeyboardInterrupt as exc:
        if not ranks.main:
            raise  # rank 0 keeps the table's folder
        raise _keep_partial(out, rows, skipped, runs, len(plan), exc) from None
    stop()  # every rank done with the process group (train.main does the same)
    if not ranks.main:
        return 0
    tables_follow()
    if not rows and not any(str(r["steps run"]).startswith("the run failed") for r in skipped):
        # Nothing could run here (CUDA kernels on a CPU, say): no table, and no folder
        # whose skipped.json would refuse the next make throughput there.
        discard_out(out)
        reasons = "; ".join(f"{r['strategy']}: {r['steps run']}" for r in skipped)
        raise UserError(f"none of the {len(plan)} strategies could run here ({reasons}); "
                        "nothing written")
    if against is not None:
        add_scaling(rows, against["rates"])
    write_tables(out, rows, skipped, runs)
    return outcome(skipped, "steps run", len(rows), "runs")


def _run_all(out: Path, base, given: dict, plan, ragged_seconds: float, rows: list,
             skipped: list, runs: list, say=print) -> None:
    """Each strategy's run; appends its row, or its skipped row, and its step times as it
    ends, so an interrupt keeps what finished (rank 0's: only rank 0 reads the summaries
    it wrote)."""
    cuda_reason = unavailable_reason()
    started = time.time()
    ranks = from_env()
    for i, (loss, backend) in enumerate(plan, 1):
        tag = f"[{i}/{len(plan)}] {describe(loss, backend)}"
        if backend == "cuda" and cuda_reason:
            say(f"{tag}: skipped ({cuda_reason})", flush=True)
            skipped.append({"strategy": describe(loss, backend),
                            "steps run": f"skipped: {cuda_reason}"})
            continue
        cfg = run_config(base, loss=loss, backend=backend, mode="train", out_dir=str(out),
                         run_name=folder_name(loss, backend),
                         **run_fields(base, given, loss, ragged_seconds, ranks.world))
        say(progress(tag, started, i - 1, len(plan)), flush=True)
        record, reason = attempt(cfg, tag)
        if record is None:
            skipped.append({"strategy": describe(loss, backend), "steps run": reason})
            continue
        if ranks.main:
            summary = load_summary(record["run_dir"])
            rows.append(row_of(summary, Path(record["run_dir"])))
            runs.append((describe(loss, backend), summary["step_times"]))


def rates_in(folder: Path) -> dict:
    """Another make throughput's table (throughput.csv): {"rates": strategy -> sustained
    samples/s, "folders": its run folders}; one line if it holds no rate, or one that is
    not a positive number."""
    table = folder / "throughput.csv"
    if not table.is_file():
        raise UserError(f"--against {display(folder)}: no throughput.csv there (a make "
                        "throughput folder, one GPU's, say)")
    try:
        with table.open(newline="") as f:
            rows = [row for row in csv.DictReader(f) if row.get("sustained samples/s")]
    except (OSError, UnicodeDecodeError, csv.Error) as exc:  # binary: 30 lines before
        raise UserError(f"--against {display(folder)}: cannot read {table.name} as a CSV "
                        f"table ({type(exc).__name__})") from None
    rates = {}
    for row in rows:
        text = row["sustained samples/s"]
        try:
            rate = float(text)
        except ValueError:
            rate = math.nan
        if not (math.isfinite(rate) and rate > 0):  # a negative one printed -242.24x
            raise UserError(f"--against {display(folder)}: {row.get('strategy')}'s sustained "
                            f"rate is {text!r}, not a positive number of samples/s")
        rates[row["strategy"]] = rate
    if not rates:
        raise UserError(f"--against {display(folder)}: its table has no sustained rate")
    return {"rates": rates, "folders": [row.get("run folder") or "" for row in rows]}


def check_against(folder: Path, against: dict, base) -> None:
    """One line if --against's runs are of another workload or step (another batch or
    image size, say): the settings --scaling-baseline checks, read from the first of its
    run folders that still holds a summary.json (none: nothing to check against)."""
    from profiling import alike
    here = {"config": dataclasses.asdict(base)}
    for name in against["folders"]:
        summary = Path(name) / "summary.json"
        if summary.is_file():
            diffs = alike.baseline_differences(read_json_object(summary, "--against"),
                                               here)
            if diffs:
                raise UserError(f"--against {display(folder)} ran another workload "
                                f"({alike.describe(diffs)}): give one GPU's make throughput "
                                "of the same settings")
            return


def add_scaling(rows: list, against: dict) -> None:
    """Each row's sustained rate over the same strategy's in the other table."""
    for row in rows:
        there, here = against.get(row["strategy"]), row["sustained samples/s"]
        row["scaling"] = f"{here / there:.2f}x" if there and here else None


def write_tables(out: Path, rows: list, skipped: list, runs: list, note: str = "") -> None:
    """throughput.md, .csv, throughput.png and steps.png; `note` opens the table. The
    skipped rows' file last: with it a folder counts as holding a throughput (fresh_out),
    so a full disk before then leaves a folder that a rerun may take."""
    columns = COLUMNS[:3] + [SCALING] + COLUMNS[3:] if any(SCALING in r for r in rows) \
        else COLUMNS
    table = markdown_of_dicts(columns, rows + skipped, left={"strategy", "timer", "budget",
                                                             "loader", "copy", "run folder"})
    if note:
        table = f"{note}\n\n{table}"
    write_whole(out / "throughput.md", table + "\n")
    write_whole(out / "throughput.csv", csv_text(columns, rows + skipped))
    where = where_of([environment()])  # the runs ran in this process
    throughput_chart(rows, out / "throughput.png", where)
    step_times_chart(runs, out / "steps.png", where)
    write_whole(out / SKIPPED, json.dumps(skipped, indent=1) + "\n")
    print(table)
    print(f"written: {display(out / 'throughput.md')}, throughput.csv, throughput.png, "
          "steps.png")
    write_page(out, table)


def _keep_partial(out: Path, rows: list, skipped: list, runs: list, planned: int, exc):
    """The table of the runs that finished before Ctrl-C or SIGTERM, in
    <out>-interrupted/ (studies/common.keep_interrupted); the error to raise."""
    def write_partial(folder: Path):
        for row in rows:  # the runs moved with the folder
            row["run folder"] = display(folder.absolute() / Path(row["run folder"]).name)
        write_tables(folder, rows, skipped, runs, note=f"**Interrupted** after "
                     f"{len(rows) + len(skipped)} of {planned} runs: the rows below are "
                     "those that ended.")
    return keep_interrupted(out, exc, f"{len(rows)} of {planned} runs finished",
                            write_partial if rows else None)


main = command(_main)

if __name__ == "__main__":
    run_command(main, "the throughput table was not written")
