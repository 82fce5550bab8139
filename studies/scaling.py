"""make scaling: the ways to spread the step over N ranks (--parallel ddp, zero, tp) side
by side, on the same seed and batches, in one table.

    make scaling GPUS=2 [ARGS="--designs ddp,zero,tp --strategy padded --steps 300
                              --scaling-baseline profiles/<one GPU's run>"]

Every rank makes the same runs, one per design; rank 0 writes scaling.md and scaling.csv
from its summary.json files. The design in full: docs/design.md, this module's section."""

import argparse
import time
from pathlib import Path

import train
from core.commands import command, run_command
from core.errors import UserError
from core.files import write_whole
from core.names import describe, parse_variants
from core.run_folder import display
from core.tables import csv_text, markdown_of_dicts
from studies.common import (
    PACE_COLUMNS,
    attempt,
    base_config,
    keep_interrupted,
    pace_cells,
    progress,
    ranks_out,
    run_config,
    tables_follow,
    write_page,
)
from studies.compare_rows import load_summary, ran_on_gpu
from studies.cost_model import Shape, sent_per_rank
from training.parallel import PARALLEL
from training.ranks import from_env, per_host, stop

PER_RUN = ("loss", "backend", "mode", "run_name", "out_dir", "parallel")
REFUSAL = "is set per run by make scaling; choose with --designs and --strategy"
COLUMNS = ["design", "GPUs", "strategy", "step median ms", "step p95 ms", *PACE_COLUMNS,
           "NCCL ms", "exposed NCCL ms", "sent GB per rank (model)", "optimizer GPU ms",
           "peak GB", "samples/s", "scaling", "run folder"]


def row_of(summary: dict, folder: Path) -> dict:
    cfg, job = summary["config"], summary.get("distributed") or {}
    rate = summary.get("sustained") or {}
    comm = ((job.get("ranks") or [{}])[0].get("communication")) or {}
    world = job.get("world", 1)
    shape = Shape(batch=cfg["batch_size"], features=256 * (cfg["image_size"] // 16) ** 2,
                  hidden=cfg["hidden"], out=cfg["max_boxes"] * 4)
    optimizer = (summary.get("phases") or {}).get("optimizer") or {}
    scale = job.get("scaling")
    # GPU figures only where there is a GPU: gloo's ranks have no NCCL or GPU time to
    # measure, and the 0.000 printed there read as a measurement.
    on_gpu = ran_on_gpu(summary)
    return {"design": cfg["parallel"], "GPUs": world,
            "strategy": describe(cfg["loss"], cfg["backend"]),
            "step median ms": rate.get("step_ms_median"), "step p95 ms": rate.get("step_ms_p95"),
            **pace_cells(summary),
            "NCCL ms": comm.get("comm_ms") if on_gpu else None,
            "exposed NCCL ms": comm.get("exposed_ms") if on_gpu else None,
            "sent GB per rank (model)": sent_per_rank(cfg["parallel"], world, shape,
                                                      g=per_host()) / 1e9,
            "optimizer GPU ms": optimizer.get("gpu_ms") if on_gpu else None,
            "peak GB": summary.get("peak_gpu_memory_gb"),
            "samples/s": rate.get("samples_per_s"),
            "scaling": f"{scale['factor']:.2f}x" if scale else None,
            "run folder": display(folder.absolute())}


def _parse(argv):
    parser = argparse.ArgumentParser(prog="make scaling", allow_abbrev=False,
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--designs", default=",".join(PARALLEL),
                        help=f"comma-separated, of {', '.join(PARALLEL)}")
    parser.add_argument("--strategy", default="padded", help="<loss>[:<kernel backend>]")
    parser.add_argument("--out", type=Path, help="a new folder (default: "
                        "profiles/scaling-<time>/)")
    return parser.parse_known_args(argv)


def _main(argv) -> int:
    args, train_args = _parse(argv)
    designs = args.designs.split(",")
    unknown = [d for d in designs if d not in PARALLEL]
    if unknown or not designs:
        raise UserError(f"--designs takes {', '.join(PARALLEL)}, not {args.designs!r}")
    strategies = parse_variants(args.strategy)
    if len(strategies) != 1:
        raise UserError(f"--strategy takes one strategy, not {args.strategy!r}")
    (loss, backend), = strategies
    ranks = from_env()
    if not ranks.distributed:
        raise UserError("make scaling compares designs of several ranks: run it with "
                        "GPUS=2 or more")
    base, _ = base_config(train_args, PER_RUN, REFUSAL)
    for design in designs:  # each design's own refusals, before any run
        train.validate(run_config(base, loss=loss, backend=backend, parallel=design),
                       ranks.world)
    out = ranks_out(ranks, args.out, "scaling", "scaling")  # rank 0 writes the table
    say = print if ranks.main else (lambda *a, **k: None)
    say(f"make scaling on {ranks.world} ranks: {len(designs)} designs of "
        f"{describe(loss, backend)}", flush=True)
    rows, failed = [], []
    started = time.time()
    try:
        for i, design in enumerate(designs, 1):
            tag = f"[{i}/{len(designs)}] --parallel {design}"
            say(progress(tag, started, i - 1, len(designs)), flush=True)
            cfg = run_config(base, loss=loss, backend=backend, mode="train", parallel=design,
                             out_dir=str(out), run_name=design)
            record, reason = attempt(cfg, tag)
            if record is None:
                failed.append({"design": design, "step median ms": reason})
            elif ranks.main:
                rows.append(row_of(load_summary(record["run_dir"]), Path(record["run_dir"])))
    except KeyboardInterrupt as exc:
        if not ranks.main:
            raise
        raise _keep_partial(out, rows, failed, len(designs), exc) from None
    stop()  # every rank done with the process group (train.main does the same)
    if not ranks.main:
        return 0
    tables_follow()
    write_table(out, rows, failed)
    return 1 if failed or not rows else 0


def _keep_partial(out: Path, rows: list, failed: list, planned: int, exc):
    """The table of the designs that finished before Ctrl-C or SIGTERM, in
    <out>-interrupted/ (studies/common.keep_interrupted), its run folders where they now
    are; the error to raise."""
    def write_partial(folder: Path):
        for row in rows:  # the runs moved with the folder
            row["run folder"] = display(folder.absolute() / Path(row["run folder"]).name)
        write_table(folder, rows, failed, note=f"**Interrupted** after {len(rows)} of "
                    f"{planned} designs: the rows below are those that ended.")
    return keep_interrupted(out, exc, f"{len(rows)} of {planned} designs finished",
                            write_partial if rows else None)


def write_table(out: Path, rows: list, failed: list, note: str = "") -> None:
    """scaling.md and scaling.csv; `note` opens the table."""
    table = markdown_of_dicts(COLUMNS, rows + failed,
                              left={"design", "strategy", "scaling", "run folder"})
    if note:
        table = f"{note}\n\n{table}"
    write_whole(out / "scaling.md", table + "\n")
    write_whole(out / "scaling.csv", csv_text(COLUMNS, rows + failed))
    print(table)
    print(f"written: {display(out / 'scaling.md')}, scaling.csv")
    write_page(out, table)


main = command(_main)

if __name__ == "__main__":
    run_command(main, "the scaling table was not written")
