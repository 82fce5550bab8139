"""make sweep's summary (sweep.md) from its rows (studies/sweep.py; the chart is
studies/charts.sweep_chart). Only rows whose status is 'ok' are drawn or fitted; the
others are listed with their reason."""

import csv
import math
from pathlib import Path

from core.tables import markdown as table
from profiling.environment import environment

AXIS_TITLES = {"batch": "batch size", "capacity": "box capacity M",
               "boxes": "valid boxes per image"}


def position(row: dict) -> float:
    """Where a row sits on its axis (the boxes axis: the measured mean per image)."""
    return {"batch": row["batch"], "capacity": row["capacity"]}.get(
        row["axis"], row.get("boxes per image"))


def ok_rows(rows, axis=None, strategy=None) -> list[dict]:
    return [r for r in rows if r["status"] == "ok" and (axis is None or r["axis"] == axis)
            and (strategy is None or r["strategy"] == strategy)]


def strategies_of(rows) -> list[str]:
    return list(dict.fromkeys(r["strategy"] for r in rows))


def slope(rows: list[dict]) -> float | None:
    """Least-squares slope of log(GPU ms) against log(axis value): 1 = linear growth,
    0 = flat (launch- or host-bound). None under two distinct positive points."""
    pts = [(math.log(position(r)), math.log(r["GPU ms"])) for r in rows
           if position(r) and position(r) > 0 and r["GPU ms"] > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    mx = sum(x for x, _ in pts) / len(pts)
    my = sum(y for _, y in pts) / len(pts)
    return (sum((x - mx) * (y - my) for x, y in pts)
            / sum((x - mx) ** 2 for x, _ in pts))


def flat_until(rows: list[dict]) -> float | None:
    """The largest axis value up to which the median stays within 1.5x of the first
    point's: the launch- or host-bound regime."""
    rows = sorted(rows, key=position)
    if not rows:
        return None
    last = position(rows[0])
    for r in rows[1:]:
        if r["GPU ms"] > 1.5 * rows[0]["GPU ms"]:
            break
        last = position(r)
    return last


def _cell(row: dict | None) -> str:
    if row is None:
        return "-"
    if row["status"] != "ok":
        return "left out" if row["status"].startswith("left out") else "failed"
    return f"{_ms(row['GPU ms'], 4)} / {_ms(row['elapsed ms'], 3)}"


def _ms(value: float, digits: int) -> str:
    """`digits` significant digits, never an exponent (2401 ms printed as 2.4e+03)."""
    return f"{value:.{digits}g}" if value < 10 ** digits else f"{value:.0f}"


def _axis_table(rows, axis) -> list[str]:
    strategies = strategies_of(rows)
    on_axis = [r for r in rows if r["axis"] == axis]
    keys = list(dict.fromkeys((r["batch"], r["capacity"], r["sigma"]) for r in on_axis))
    head = ["batch", "M", "sigma", "boxes per image"] + strategies
    lines = []
    for key in keys:
        cells = {r["strategy"]: r for r in on_axis if (r["batch"], r["capacity"],
                                                       r["sigma"]) == key}
        per_image = next((f"{r['boxes per image']:.3g}" for r in cells.values()
                          if r["status"] == "ok"), "-")
        lines.append([str(key[0]), str(key[1]), key[2], per_image]
                     + [_cell(cells.get(s)) for s in strategies])
    return table(head, lines).splitlines()


def _fits(rows) -> list[str]:
    head = ["strategy"] + [f"slope vs {t}" for t in AXIS_TITLES.values()] + \
        [f"flat until ({t})" for t in AXIS_TITLES.values()]
    lines = []
    for s in strategies_of(rows):
        slopes = [slope(ok_rows(rows, a, s)) for a in AXIS_TITLES]
        flats = [flat_until(ok_rows(rows, a, s)) for a in AXIS_TITLES]
        lines.append([s] + ["-" if v is None else f"{v:.2f}" for v in slopes]
                     + ["-" if v is None else f"{v:.4g}" for v in flats])
    return table(head, lines, left={"strategy"}).splitlines()


def _same_point(rows, row, strategy) -> dict | None:
    return next((x for x in ok_rows(rows, row["axis"], strategy)
                 if (x["batch"], x["capacity"], x["sigma"]) ==
                 (row["batch"], row["capacity"], row["sigma"])), None)


def _versus(rows, strategy: str, other: str, fields: tuple[str, ...]) -> list[str]:
    """`strategy` (any backend) against `other` on the same backend, point by point: each
    field of both and their ratio, other / strategy (above 1: `strategy` is faster)."""
    head = ["axis", "batch", "M", "sigma", "backend"]
    for f in fields:
        head += [f"{other} {f}", f"{strategy} {f}", "ratio"]
    lines = []
    for r in ok_rows(rows):
        name, _, backend = r["strategy"].partition("/")
        if name != strategy:
            continue
        for b in ([backend] if backend else ["triton", "cuda"]):
            o = _same_point(rows, r, f"{other}/{b}")
            if not o:
                continue
            line = [r["axis"], str(r["batch"]), str(r["capacity"]), r["sigma"], b]
            for f in fields:
                line += [f"{o[f]:.4g}", f"{r[f]:.4g}",
                         f"{o[f] / r[f]:.2f}" if r[f] else "-"]
            lines.append(line)
    return table(head, lines, left={"axis", "backend"}).splitlines()


def _targets_cost(rows) -> list[str]:
    """What each layout costs from the samples to the gradient, at each point."""
    head = ["axis", "batch", "M", "sigma", "strategy", "collate ms (host)", "H2D ms (GPU)",
            "H2D bytes", "loss GPU ms", "targets ms"]
    lines = []
    for r in ok_rows(rows):
        copy = "-" if r["H2D ms"] in (None, "") else f"{r['H2D ms']:.4g}"
        lines.append([r["axis"], str(r["batch"]), str(r["capacity"]), r["sigma"],
                      r["strategy"], f"{r['collate ms']:.3g}", copy,
                      f"{int(r['H2D bytes']):,}", f"{r['GPU ms']:.4g}",
                      f"{r['targets ms']:.4g}"])
    return table(head, lines, left={"axis", "strategy"}).splitlines()


def _largest(rows) -> list[str]:
    """Bandwidth at each axis' largest measured point."""
    head = ["axis", "batch", "M", "sigma", "strategy", "bytes (layout)", "GPU ms", "GB/s",
            "% of peak", "launches", "H2D copies", "host ms"]
    lines = []
    for axis in AXIS_TITLES:
        for s in strategies_of(rows):
            ok = ok_rows(rows, axis, s)
            if not ok:
                continue
            r = max(ok, key=position)
            peak = "-" if r["% of peak"] in (None, "") else f"{r['% of peak']:.1f}"
            lines.append([axis, str(r["batch"]), str(r["capacity"]), r["sigma"], s,
                          f"{r['bytes']:,}", _ms(r["GPU ms"], 4), f"{r['GB/s']:.3g}", peak,
                          str(r["launches"]), str(r["H2D copies"]), _ms(r["host ms"], 3)])
    return table(head, lines, left={"axis", "strategy"}).splitlines()


def markdown(rows: list[dict], args, seconds: float) -> str:
    env = environment()
    timer = next((r["timer"] for r in rows if r["status"] == "ok"), "-")
    out = [f"# make sweep: the loss alone, forward + backward, {args.preset} grid", "",
           f"Device {env['device']}, torch {env['torch']}, Triton {env['triton']}, commit "
           f"{env['commit'] or 'unknown (not a git checkout)'}, {env['date']}; "
           f"{seconds:.0f} s. Per call of "
           "`loss(pred, targets).backward()`, medians: **GPU ms**, the GPU's own work (the "
           "profiler's kernel, copy and memset durations of each call, over repeated "
           f"calls), and **elapsed ms**, {timer}: the time the call takes as the stream "
           "sees it, which for small or host-bound calls is the host's time to issue it. "
           "sweep.csv has the 20th and 80th percentiles of both, host ms, launches, H2D "
           "copies, the layout's bytes and bandwidth.", ""]
    if args.preset == "cpu":
        out += ["**On a CPU the times mean nothing about a GPU**: the Triton kernels run "
                "in Triton's interpreter and there is no CUDA backend; the GPU and elapsed "
                "columns both hold the call's wall time, and launches count none.", ""]
    b0, m0, s0 = args.centre
    out += [f"Each axis is varied alone around batch {b0}, M {m0}, sigma {s0:g}; the boxes "
            f"axis at M {args.boxes_capacity}.", ""]
    for axis, title in AXIS_TITLES.items():
        out += [f"## Against {title}", "", "GPU ms / elapsed ms per call.", ""] + \
            _axis_table(rows, axis) + [""]
    out += ["## How each strategy grows", "",
            "Slope of log(GPU ms) against log(axis value) (1: linear in the work, 0: flat, "
            "the GPU's fixed cost per launch); 'flat until': the largest value whose GPU ms "
            "is within 1.5x of the axis' first point.", ""] + _fits(rows) + [""]
    out += ["## conditional against kernel, GPU ms (above 1: conditional is faster)", ""] + \
        _versus(rows, "conditional", "kernel", ("GPU ms",)) + [""]
    out += ["## What the targets cost, from the samples to the gradient", "",
            "collate ms: the host's time to build the targets (the images are one pixel "
            "here); H2D ms: the GPU time of their copies from pinned memory; loss GPU ms: "
            "forward and backward; targets ms: the three added, host and GPU time, as a "
            "step that waits for its batch sees them.", ""] + _targets_cost(rows) + [""]
    for layout in ("packed", "nested"):
        if any(r["strategy"].partition("/")[0] == layout for r in ok_rows(rows)):
            out += [f"## {layout} against conditional (ratio above 1: {layout} is faster)",
                    ""] + _versus(rows, layout, "conditional",
                                  ("targets ms", "GPU ms")) + [""]
    out += ["## Bytes and bandwidth at each axis' largest point", "",
            "Bytes: the least the layout makes the loss read and write "
            "(studies/sweep_point.layout_bytes); GB/s: those bytes over the median time.",
            ""] + _largest(rows) + [""]
    others = [r for r in rows if r["status"] != "ok"]
    if others:
        out += ["## Left out or failed", ""] + [
            f"- {r['axis']}: batch {r['batch']}, M {r['capacity']}, sigma {r['sigma']}, "
            f"{r['strategy']}: {r['status']}" for r in others] + [""]
    return "\n".join(out)


NUMBERS = ("batch", "capacity", "GPU ms", "GPU p20 ms", "GPU p80 ms", "elapsed ms",
           "elapsed p20 ms", "elapsed p80 ms", "boxes per image", "collate ms", "H2D ms",
           "H2D bytes", "targets ms")


def read_rows(path: Path) -> list[dict]:
    """sweep.csv's rows with their numbers back (make sweep ARGS="--redraw DIR")."""
    rows = []
    for r in csv.DictReader(path.open()):
        rows.append({k: (float(v) if k in NUMBERS and v != "" else v) for k, v in r.items()})
    return rows


