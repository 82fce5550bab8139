"""The memory timeline by category as one HTML page that opens offline: an inline SVG of
stacked areas and a table, no script, no font or style fetched. (torch's own pages do not:
export_memory_timeline's HTML is a PNG drawn by matplotlib, and the snapshot viewer loads
its script from the network.)

    write(path, title, timeline, memory)   timeline: memory_account.by_category's,
                                           memory: memory_account.account's
"""

import html
import math
from pathlib import Path

from profiling import memory_account

# Bottom to top: what lives the whole run first, then what a step makes and frees.
ORDER = ("parameters", "optimizer state", "gradients", "inputs", "activations",
         "temporaries", "autograd detail", "unknown")
# torch.profiler._memory_profiler's colours, so the page reads like its plots.
COLOURS = {"parameters": "darkgreen", "optimizer state": "goldenrod", "inputs": "black",
           "temporaries": "mediumpurple", "activations": "red", "gradients": "mediumblue",
           "autograd detail": "royalblue", "unknown": "grey"}

WIDTH, HEIGHT, LEFT, BOTTOM, TOP, RIGHT = 1000, 420, 70, 40, 10, 20
# At most this many columns are drawn; a column keeps the highest of its points, so the
# peak is always drawn.
MAX_COLUMNS = 1500


def write(path: Path, title: str, timeline: dict, memory: dict) -> None:
    from core.files import write_whole
    write_whole(path, page(title, timeline, memory))


def page(title: str, timeline: dict, memory: dict) -> str:
    names = [n for n in ORDER if n in timeline["bytes"]]
    peak = memory["peak_by_category"]
    own_max = {n: max(timeline["bytes"][n], default=0) for n in names}
    rows = "".join(
        f"<tr><td><span class=key style='background:{COLOURS[n]}'></span>{n}</td>"
        f"<td>{peak['bytes'][n] / 1e9:.3f}</td><td>{own_max[n] / 1e9:.3f}</td></tr>"
        for n in reversed(names))
    rows += (f"<tr class=total><td>total</td><td>{peak['total_bytes'] / 1e9:.3f}</td>"
             "<td></td></tr>")
    alloc = memory["allocator"]
    snapshot = "" if not alloc else (
        f"<p>Allocator snapshot <code>{html.escape(alloc['snapshot'])}</code> (open it in "
        "https://pytorch.org/memory_viz): peak "
        f"{alloc['snapshot_peak_bytes'] / 1e9:.3f} GB over its {alloc['trace_entries']} "
        "entries; <code>torch.cuda.max_memory_allocated</code> over the same steps "
        f"{alloc['max_memory_allocated_bytes'] / 1e9:.3f} GB.</p>")
    at = "" if peak["at_ms"] is None else f" at {peak['at_ms']:.1f} ms"
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}: memory</title>
<style>
body {{ font-family: sans-serif; margin: 20px; color: #222 }}
table {{ border-collapse: collapse }} td, th {{ padding: 3px 10px; text-align: right }}
td:first-child, th:first-child {{ text-align: left }} tr.total td {{ font-weight: bold }}
.key {{ display: inline-block; width: 12px; height: 12px; margin-right: 6px }}
svg text {{ font-size: 12px; fill: #444 }}
</style></head><body>
<h2>{html.escape(title)}</h2>
<p>GPU memory over the profiled steps, by what torch.profiler found each tensor to be
(peak {peak['total_bytes'] / 1e9:.3f} GB{at}). Each allocation is placed at the host's
time of the operator that made it; the host runs ahead of the GPU and, recording stacks
for this page, slower than in a plain run.</p>
{chart(timeline, names, peak["total_bytes"])}
<table><tr><th>category</th><th>GB at the peak</th><th>GB at its own most</th></tr>
{rows}</table>
{snapshot}
</body></html>
"""


def chart(timeline: dict, names: list[str], peak_bytes: int) -> str:
    """Stacked step areas (each allocation holds until the next point), GB against ms, up
    to the peak (which _columns always keeps)."""
    times = timeline["times_us"]
    if not times:
        return "<p>No memory events were recorded.</p>"
    keep = _columns(timeline)
    t0, t_end = times[0], max(times[-1], times[0] + 1)
    top = _nice(peak_bytes / 1e9)
    inner_w, inner_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM

    def x(t):
        return LEFT + (t - t0) / (t_end - t0) * inner_w

    def y(gb):
        return TOP + inner_h - gb / top * inner_h

    shapes, below = [], [0.0] * len(keep)
    for n in names:
        above = [b + timeline["bytes"][n][i] / 1e9 for b, i in zip(below, keep)]
        upper = _steps([x(times[i]) for i in keep], [y(v) for v in above], x(t_end))
        lower = _steps([x(times[i]) for i in keep], [y(v) for v in below], x(t_end))
        points = upper + lower[::-1]
        shapes.append(f"<polygon fill='{COLOURS[n]}' fill-opacity='0.85' points='"
                      + " ".join(f"{px:.1f},{py:.1f}" for px, py in points)
                      + f"'><title>{n}</title></polygon>")
        below = above
    ticks = []
    for k in range(5):
        gb = top * k / 4
        ticks.append(f"<line x1='{LEFT}' x2='{WIDTH - RIGHT}' y1='{y(gb):.1f}' "
                     f"y2='{y(gb):.1f}' stroke='#ddd'/><text x='{LEFT - 6}' "
                     f"y='{y(gb) + 4:.1f}' text-anchor='end'>{gb:g}</text>")
    span_ms = (t_end - t0) / 1e3
    step = _nice(span_ms / 5)
    for k in range(int(span_ms / step) + 1):
        ms = k * step
        ticks.append(f"<text x='{x(t0 + ms * 1e3):.1f}' y='{HEIGHT - BOTTOM + 16}' "
                     f"text-anchor='middle'>{ms:g}</text>")
    middle = TOP + inner_h / 2
    labels = (f"<text x='{LEFT + inner_w / 2}' y='{HEIGHT - 4}' text-anchor='middle'>ms "
              "from the first profiled step, on the host's clock</text>"
              f"<text x='14' y='{middle}' transform='rotate(-90 14 {middle})' "
              "text-anchor='middle'>GB</text>")
    return (f"<svg xmlns='http://www.w3.org/2000/svg' width='{WIDTH}' height='{HEIGHT}' "
            f"role='img' aria-label='memory by category'>{''.join(ticks)}"
            f"{''.join(shapes)}{labels}</svg>")


def _columns(timeline: dict) -> list[int]:
    """The points drawn: all of them, or per column of time the one with the most bytes."""
    times = timeline["times_us"]
    if len(times) <= MAX_COLUMNS:
        return list(range(len(times)))
    span = max(times[-1] - times[0], 1)
    totals = memory_account.totals(timeline)
    best: dict[int, int] = {}
    for i, t in enumerate(times):
        column = min(MAX_COLUMNS - 1, int((t - times[0]) / span * MAX_COLUMNS))
        if column not in best or totals[i] > totals[best[column]]:
            best[column] = i
    return sorted(best.values())


def _steps(xs: list[float], ys: list[float], x_end: float) -> list[tuple[float, float]]:
    """A step line through the points: each level holds until the next point."""
    out = []
    for k, (px, py) in enumerate(zip(xs, ys)):
        out.append((px, py))
        out.append((xs[k + 1] if k + 1 < len(xs) else x_end, py))
    return out


def _nice(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 times a power of ten at or above value."""
    if value <= 0:
        return 1.0
    power = 10 ** math.floor(math.log10(value))
    return next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= value)
