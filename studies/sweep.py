"""make sweep: each loss strategy's cost (forward + backward, no model) as the work grows.

    python3 -m studies.sweep [--batch 64,256,...] [--capacity 256,1024,...]
                                   [--sigma 1,3,...,full] [--strategies padded,kernel:cuda]

Three axes, one at a time, around the workload's point: the batch, the box capacity M and
the boxes per image; each point is studies/sweep_point.measure. Writes sweep.csv, sweep.md
and sweep.png under profiles/sweep-<UTC time>/; a point that fails is a row that says so.
The design in full: docs/design.md, this module's section."""

import argparse
import math
import time
from pathlib import Path

import torch

from core.commands import command, run_command
from core.errors import StudyInterrupted, UserError, one_line
from core.files import write_whole
from core.names import describe, parse_variants, variants
from core.run_folder import display
from core.tables import csv_text
from kernels.giou.cuda_extension import unavailable_reason
from profiling.environment import environment
from studies.charts import sweep_chart, where_of
from studies.common import fresh_out, keep_interrupted, tables_follow, write_page
from studies.sweep_point import measure, samples, sigma_label
from studies.sweep_report import markdown, read_rows

AXES = {"batch": "batch size", "capacity": "box capacity M", "boxes": "boxes per image"}
# (batch sizes, capacities, sigmas, the centre (batch, capacity, sigma), the boxes axis' M,
# the loop's largest batch: its host time grows with every sample).
GRIDS = {
    "gpu": dict(batch=[64, 256, 1024, 4096, 8192], capacity=[256, 1024, 4096],
                sigma=[1, 3, 10, 30, 100, 300, math.inf], centre=(1024, 256, 3.0),
                boxes_capacity=1024, loop_max_batch=256, rep_ms=100),
    "cpu": dict(batch=[2, 8], capacity=[16, 64], sigma=[3, math.inf], centre=(4, 16, 3.0),
                boxes_capacity=16, loop_max_batch=8, rep_ms=20),
}
COLUMNS = ["axis", "batch", "capacity", "sigma", "strategy", "status", "GPU ms", "GPU p20 ms",
           "GPU p80 ms", "elapsed ms", "elapsed p20 ms", "elapsed p80 ms", "host ms",
           "launches", "H2D copies", "collate ms", "H2D ms", "H2D bytes", "targets ms",
           "valid boxes", "boxes per image", "bytes", "GB/s",
           "% of peak", "timer"]


def _numbers(text: str, kind, name: str) -> list:
    try:
        values = [math.inf if v.strip() == "full" else kind(v) for v in text.split(",")]
    except ValueError:
        raise UserError(f"--{name} takes a comma-separated list of numbers"
                        + (" (or 'full')" if name == "sigma" else "") + f", not {text!r}"
                        ) from None
    if not values or not all(v > 0 for v in values):  # nan is not > 0 either
        raise UserError(f"--{name} values must be positive, got {text!r}")
    return values


def _at_least(args, name: str, low: int) -> None:
    value = getattr(args, name.replace("-", "_"))
    if value < low:
        raise UserError(f"--{name} must be at least {low}, got {value}")


def parse(argv) -> argparse.Namespace:
    preset = "gpu" if torch.cuda.is_available() else "cpu"
    grid = GRIDS[preset]
    p = argparse.ArgumentParser(prog="make sweep", description=__doc__.split("\n\n")[0],
                                allow_abbrev=False,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--batch", default=",".join(map(str, grid["batch"])),
                   help=f"comma-separated batch sizes of the batch axis ({preset} preset)")
    p.add_argument("--capacity", default=",".join(map(str, grid["capacity"])),
                   help="comma-separated box capacities M of the capacity axis")
    p.add_argument("--sigma", default=",".join("full" if math.isinf(s) else f"{s:g}"
                                                for s in grid["sigma"]),
                   help="comma-separated spreads of the boxes per image ('full': every "
                        "image holds M boxes)")
    p.add_argument("--boxes-capacity", type=int, default=grid["boxes_capacity"],
                   help="M of the boxes-per-image axis")
    p.add_argument("--strategies", default=",".join(variants()),
                   help="comma-separated, <loss>[:<kernel backend>]")
    p.add_argument("--loop-max-batch", type=int, default=grid["loop_max_batch"],
                   help="the loop runs only up to this batch size")
    p.add_argument("--rep-ms", type=int, default=grid["rep_ms"],
                   help="time per point given to the timer")
    p.add_argument("--seed", type=int, default=0, help="the synthetic targets' seed")
    p.add_argument("--out", type=Path, default=argparse.SUPPRESS,
                   help="a new folder for the sweep (default: profiles/sweep-<UTC time>/)")
    p.add_argument("--redraw", type=Path, default=argparse.SUPPRESS, metavar="DIR",
                   help="draw DIR/sweep.png again from DIR/sweep.csv; nothing is measured")
    args = p.parse_args(argv)
    for name in ("out", "redraw"):  # SUPPRESSed defaults: their help says what none means
        setattr(args, name, getattr(args, name, None))
    args.preset = preset
    args.batch = _numbers(args.batch, int, "batch")
    args.capacity = _numbers(args.capacity, int, "capacity")
    args.sigma = _numbers(args.sigma, float, "sigma")
    _at_least(args, "boxes-capacity", 1)
    _at_least(args, "rep-ms", 1)
    _at_least(args, "loop-max-batch", 0)
    args.strategies = parse_variants(args.strategies)
    args.centre = GRIDS[preset]["centre"]
    return args


def points(args) -> list[tuple[str, int, int, float]]:
    """(axis, batch, capacity, sigma): each axis varied alone around the centre."""
    b0, m0, s0 = args.centre
    return ([("batch", b, m0, s0) for b in args.batch]
            + [("capacity", b0, m, s0) for m in args.capacity]
            + [("boxes", b0, args.boxes_capacity, s) for s in args.sigma])


def left_out(loss: str, backend: str, batch: int, args,
             cuda_reason: str | None) -> str | None:
    if loss == "loop" and batch > args.loop_max_batch:
        return (f"left out: the loop takes ~3 ms of host time per sample a call; it runs up "
                f"to batch {args.loop_max_batch} (--loop-max-batch)")
    if backend == "cuda" and cuda_reason:
        return f"left out: {cuda_reason}"
    return None


def run(args, rows: list | None = None) -> list[dict]:
    """Every point's row, appended to `rows` as it is measured (the caller keeps those
    done if the sweep is interrupted)."""
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    cuda_reason = unavailable_reason()
    plan = [(pt, s) for pt in points(args) for s in args.strategies]
    rows = [] if rows is None else rows
    done, data, started = {}, {}, time.time()
    print(f"make sweep: {len(plan)} points (axis point x strategy), each timed for about "
          f"{args.rep_ms} ms and profiled; about 3 minutes on an H100 at the default grid",
          flush=True)
    if device.type == "cpu":
        print("make sweep on a CPU: a small grid, Triton's interpreter; the times mean "
              "nothing about a GPU", flush=True)
    for i, ((axis, batch, capacity, sigma), (loss, backend)) in enumerate(plan, 1):
        row = {"axis": axis, "batch": batch, "capacity": capacity,
               "sigma": sigma_label(sigma), "strategy": describe(loss, backend)}
        tag = (f"[{i}/{len(plan)}] {axis}: batch {batch}, M {capacity}, sigma "
                 f"{row['sigma']}, {row['strategy']}")
        key = (loss, backend, batch, capacity, sigma)
        reason = left_out(loss, backend, batch, args, cuda_reason)
        if reason:
            row["status"] = reason
        elif key in done:  # the centre point lies on two axes: measured once
            row.update(done[key])
        else:
            if (batch, capacity, sigma) not in data:  # one batch per point, every strategy
                data[(batch, capacity, sigma)] = samples(batch, capacity, sigma, args.seed)
            pairs = data[(batch, capacity, sigma)]
            try:
                figures = {"status": "ok", **measure(loss, backend, batch,
                                                     capacity, sigma, pairs, device, dtype,
                                                     args.seed, args.rep_ms)}
            except Exception as exc:  # out of memory at the largest sizes, say: a row
                figures = {"status": f"failed: {one_line(exc)}"}
                if device.type == "cuda":
                    torch.cuda.empty_cache()
            done[key] = figures
            row.update(figures)
        rows.append(row)
        print(f"{tag}: {_progress(row)} ({time.time() - started:.0f} s)", flush=True)
        if len(data) > 2:  # keep the host memory of a few points only
            data.pop(next(iter(data)))
    return rows


def _progress(row: dict) -> str:
    if row["status"] != "ok":
        return row["status"]
    if "CPU wall" in row["timer"]:  # no GPU: one figure, the call's wall time
        return (f"wall {row['GPU ms']:.4g} ms (p20 {row['GPU p20 ms']:.4g}, p80 "
                f"{row['GPU p80 ms']:.4g}), {row['boxes per image']:.3g} boxes/image")
    return (f"GPU {row['GPU ms']:.4g} ms (p20 {row['GPU p20 ms']:.4g}, p80 "
            f"{row['GPU p80 ms']:.4g}), elapsed {row['elapsed ms']:.4g} ms, "
            f"{row['launches']:g} launches, {row['boxes per image']:.3g} boxes/image")


def _where_measured(folder: Path) -> str:
    """The device and commit sweep.md's first line names (markdown() writes it), for a
    redrawn chart's title; what it cannot read it says."""
    import re
    md = folder / "sweep.md"
    found = re.search(r"^Device (.+?), torch .*?, commit (\w+)",
                      md.read_text(errors="replace") if md.is_file() else "", re.M)
    return (where_of([{"device": found[1], "commit": found[2]}]) if found
            else f"{display(folder)}/sweep.md names no device")


def _redraw(folder: Path) -> int:
    if not (folder / "sweep.csv").exists():
        raise UserError(f"no sweep.csv in {folder}")
    rows = read_rows(folder / "sweep.csv")
    # The columns the chart reads (a sweep's CSV from an older commit may lack others).
    missing = [c for c in ("axis", "batch", "capacity", "sigma", "strategy", "status",
                           "GPU ms", "timer") if rows and c not in rows[0]]
    if not rows or missing:
        raise UserError(f"{folder / 'sweep.csv'} is not a sweep's table (" +
                        (f"no column {missing[0]!r})" if rows else "no rows)"))
    preset = "cpu" if any("CPU wall" in r["timer"] for r in rows) else "gpu"
    sweep_chart(rows, folder / "sweep.png", _where_measured(folder), preset)
    print(f"redrawn: {display(folder)}/sweep.png")
    return 0


def _main(argv) -> int:
    args = parse(argv)
    if args.redraw:
        return _redraw(args.redraw)
    out = fresh_out(args.out, "sweep", "sweep")
    started = time.time()
    rows = []
    try:
        run(args, rows)
    except KeyboardInterrupt as exc:
        # The points measured so far are kept, marked; an empty folder is not left.
        raise _keep_partial(out, rows, args, time.time() - started, exc) from None
    tables_follow()
    write_whole(out / "sweep.csv", csv_text(COLUMNS, rows))
    table = markdown(rows, args, time.time() - started)
    write_whole(out / "sweep.md", table)
    sweep_chart(rows, out / "sweep.png", where_of([environment()]), args.preset)
    failed = sum(r["status"].startswith("failed") for r in rows)
    print(f"sweep done in {time.time() - started:.0f} s: {display(out)}/sweep.md, sweep.csv, "
          f"sweep.png" + (f"; {failed} points failed (rows in the table)" if failed else ""),
          flush=True)
    write_page(out, table)
    return 1 if failed else 0


def _keep_partial(out: Path, rows: list, args, seconds: float, exc) -> StudyInterrupted:
    """The interrupted sweep's rows, in <out>-interrupted/ (the folder is removed if no
    point was measured); the error to raise."""
    def write_partial(folder: Path):
        write_whole(folder / "sweep.csv", csv_text(COLUMNS, rows))
        write_whole(folder / "sweep.md", f"**Interrupted** after {len(rows)} points: the rows "
                    "below are those measured.\n\n" + markdown(rows, args, seconds))
    return keep_interrupted(out, exc, f"{len(rows)} points measured",
                            write_partial if rows else None)


main = command(_main)


if __name__ == "__main__":
    run_command(main, "the sweep's table and chart were not written")
