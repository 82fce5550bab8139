"""Every chart the studies draw (compare, ladder, sweep, throughput, step times, loss curves),
and what they share: matplotlib without a display, the bars' labels, a panel with nothing
measured, a CPU run's caveat. Every chart's top line says where its figures were measured,
so that a picture copied into a doc still says what it shows. The design in full:
docs/design.md, this module's section."""

from pathlib import Path

from studies.sweep_report import AXIS_TITLES, ok_rows, position, strategies_of

CPU_NOTE = "CPU: the times say nothing about a GPU"


def _pyplot():
    import matplotlib
    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt
    return plt


def _save(plt, fig, path: Path, dpi: int) -> None:
    from core.files import whole
    fig.tight_layout()
    try:
        with whole(path) as partial:  # a full disk leaves no half-written PNG
            fig.savefig(partial, dpi=dpi, format=path.suffix.lstrip(".") or "png")
    finally:
        plt.close(fig)


def where_of(environments) -> str:
    """'<device>, commit <hash>' of the runs a chart draws (summary.json's environment),
    each distinct one once; a commit with uncommitted changes says so."""
    seen = []
    for env in environments:
        env = env or {}
        commit = (env.get("commit") or "")[:7] or "not recorded"
        seen.append(f"{env.get('device') or 'device not recorded'}, commit {commit}"
                    + (" with changes" if env.get("dirty") else ""))
    return "; ".join(dict.fromkeys(seen)) or "nothing measured"


def _headline(fig, where: str, note: str = "") -> None:
    fig.suptitle("\n".join(filter(None, [note, where])), fontsize=9)


def _label_bars(ax, xs, values, fontsize: int) -> None:
    for x, v in zip(xs, values):
        if v:
            ax.annotate(f"{v:.3g}", (x, v), ha="center", va="bottom", fontsize=fontsize)


def _run_label(row: dict) -> str:
    """The strategy, and the fields in which the compared runs differ (batch 64...)."""
    from profiling.alike import FIELDS
    apart = [f"{name} {row[name]}" for name in FIELDS if name in row]
    return row["strategy"] + (f" ({', '.join(apart)})" if apart else "")


def _no_runs(ax, title: str) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"{title}\n\nno measured runs", ha="center", va="center",
            transform=ax.transAxes)


WIDE = 20  # a panel whose bars are further apart than this goes to a log axis, and says so


def compare_chart(rows: list[dict], path: Path, where: str) -> None:
    """Left: the loss range's CPU time in forward mode (the original's figure), on a log
    axis only where its bars are over WIDE times apart (its title says so).
    Right: the train step's GPU and CPU time per strategy. The step, not the loss: with a
    CUDA graph the loss is inside one replay, and a strategy's host cost shows as CPU time
    above the GPU time."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    title = "forward mode: loss range, CPU ms/step"
    measured = [r for r in rows if r["mode"] == "forward" and r.get("loss CPU ms") is not None]
    if measured:
        values = [r["loss CPU ms"] for r in measured]
        left.bar([_run_label(r) for r in measured], values, color="#4c72b0")
        if min(values) > 0 and max(values) > WIDE * min(values):
            left.set_yscale("log")  # the per-sample loop beside a fused kernel: 100x apart
            title += " (log scale)"
        _label_bars(left, range(len(values)), values, 8)
        left.set_title(title)
        left.set_ylabel("ms per step")
        left.tick_params(axis="x", rotation=35)
    else:
        _no_runs(left, title)

    title = "train mode: step GPU and CPU ms/step"
    measured = [r for r in rows if r["mode"] == "train" and r.get("step CPU ms") is not None]
    on_gpu = any(r.get("step GPU ms") is not None for r in rows)
    if not on_gpu:
        title = "train mode: step CPU ms/step (no GPU times here)"
    if measured:
        xs = range(len(measured))
        bars = ((-0.2, "step GPU ms", "#4c72b0"), (0.2, "step CPU ms", "#dd8452"))
        for offset, key, color in bars if on_gpu else ((0.0, "step CPU ms", "#dd8452"),):
            values = [r.get(key) or 0.0 for r in measured]
            right.bar([x + offset for x in xs], values, width=0.4 if on_gpu else 0.6,
                      color=color, label=key.replace(" ms", ""))
            _label_bars(right, [x + offset for x in xs], values, 7)
        right.set_xticks(list(xs), [_run_label(r) + (" (graph)" if r.get("CUDA graph") == "yes"
                                                     else "") for r in measured])
        # Linear, from zero: on a log axis 550 and 569 ms looked several times apart.
        right.legend()
        right.set_title(title)
        right.set_ylabel("ms per step")
        right.tick_params(axis="x", rotation=35)
    else:
        _no_runs(right, title)
    _headline(fig, where, "" if on_gpu else CPU_NOTE)
    _save(plt, fig, path, dpi=110)


def ladder_chart(rows: list[dict], path: Path, where: str, goal_ms: float) -> None:
    """Step time per rung, one bar group per strategy; GPU time where there is a GPU (with
    the goal drawn), CPU time otherwise."""
    plt = _pyplot()
    measured = [r for r in rows if isinstance(r.get("step CPU ms"), float)]
    on_gpu = any(isinstance(r.get("step GPU ms"), float) for r in measured)
    key = "step GPU ms" if on_gpu else "step CPU ms"
    strategies = list(dict.fromkeys(r["strategy"] for r in measured))
    rungs = list(dict.fromkeys(r["rung"] for r in measured))
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(rungs)), 4.5))
    width = 0.8 / max(len(strategies), 1)
    for i, strategy in enumerate(strategies):
        by_rung = {r["rung"]: r[key] for r in measured if r["strategy"] == strategy}
        xs = [j + (i - (len(strategies) - 1) / 2) * width for j, rung in enumerate(rungs)
              if rung in by_rung]
        values = [by_rung[rung] for rung in rungs if rung in by_rung]
        ax.bar(xs, values, width=width, label=strategy)
        _label_bars(ax, xs, values, 7)
    if on_gpu:
        ax.axhline(goal_ms, color="gray", linestyle="--", linewidth=1)
        ax.annotate(f"goal {goal_ms:g} ms", (len(rungs) - 0.6, goal_ms), va="bottom",
                    fontsize=8, color="gray")
    ax.set_xticks(range(len(rungs)), rungs, rotation=20)
    ax.set_ylabel(f"{key.replace(' ms', '')} ms per step")
    ax.set_title("train step, speed-ups added one at a time" +
                 ("" if on_gpu else f" ({CPU_NOTE})"))
    _headline(fig, where)
    if measured:
        ax.legend()
    _save(plt, fig, path, dpi=110)


def sweep_chart(rows: list[dict], path: Path, where: str, preset: str) -> None:
    """Log-log panels, one column per axis: the GPU's work per call (top) and the elapsed
    time per call (bottom); each strategy's median with its p20-p80 bar. On a CPU (the
    cpu preset) one row: the host's time per call, as no GPU work exists to draw."""
    from matplotlib.ticker import NullFormatter
    plt = _pyplot()
    measures = (("GPU", "GPU ms per call (its kernels)"),
                ("elapsed", "elapsed ms per call (stream)"))
    if preset == "cpu":
        measures = (("elapsed", "host ms per call (no GPU)"),)
    # One colour per strategy in every panel (a strategy left out of a panel must not
    # shift the others' colours), and no two alike: eleven strategies outrun matplotlib's
    # ten-colour cycle, so tab20's colours past ten are used too.
    palette = [f"C{i}" for i in range(10)] + [plt.get_cmap("tab20")(i) for i in range(1, 20, 2)]
    colours = {s: palette[i % len(palette)] for i, s in enumerate(strategies_of(rows))}
    fig, grid = plt.subplots(len(measures), len(AXIS_TITLES),
                             figsize=(16, 4.5 * len(measures) + 0.5), squeeze=False)
    for row_axes, (key, ylabel) in zip(grid, measures):
        for ax, (axis, title) in zip(row_axes, AXIS_TITLES.items()):
            xs = set()
            for s in strategies_of(rows):
                ok = sorted(ok_rows(rows, axis, s), key=position)
                if not ok:
                    continue
                ys = [r[f"{key} ms"] for r in ok]
                # Quantiles interpolate: one can pass the median by a rounding (p20 =
                # median + 9e-19 ms, an H100's sweep), and matplotlib refuses a negative
                # error bar.
                err = [[max(0.0, y - r[f"{key} p20 ms"]) for y, r in zip(ys, ok)],
                       [max(0.0, r[f"{key} p80 ms"] - y) for y, r in zip(ys, ok)]]
                ax.errorbar([position(r) for r in ok], ys, yerr=err, marker="o", ms=3,
                            capsize=2, label=s, color=colours[s])
                xs.update(position(r) for r in ok)
            if xs:
                ax.set_xscale("log")
                ax.set_yscale("log")
                ax.set_xticks(sorted(xs), [f"{x:.4g}" for x in sorted(xs)])
                ax.xaxis.set_minor_formatter(NullFormatter())
            ax.set_xlabel(title)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{ylabel.split(' ms')[0]}: against {title}")
            ax.grid(True, which="both", alpha=0.3)
    handles = {h.get_label(): h for ax in grid.flat
               for h in ax.get_legend_handles_labels()[0]}
    grid[0][0].legend([handles[s] for s in colours if s in handles],
                      [s for s in colours if s in handles], fontsize=7)
    note = f" ({CPU_NOTE}: Triton's interpreter)" if preset == "cpu" else ""
    _headline(fig, where, "GIoU loss alone, forward + backward: median with p20-p80" + note)
    _save(plt, fig, path, dpi=100)


def throughput_chart(rows: list[dict], path: Path, where: str) -> None:
    """Per strategy, the samples/s it sustained over the run beside the GPU's own rate
    (the batch over its profiled GPU work), the share written above."""
    plt = _pyplot()
    measured = [r for r in rows if r.get("sustained samples/s")]
    fig, ax = plt.subplots(figsize=(max(7, 1.3 * len(measured)), 4.5))
    if not measured:
        _no_runs(ax, "sustained samples/s")
    xs = range(len(measured))
    # Without a GPU there is no GPU rate: no bar, and no empty legend entry, for it.
    bars = [("sustained samples/s", "#dd8452")] + (
        [("GPU's rate samples/s", "#4c72b0")]
        if any(r.get("GPU's rate samples/s") for r in measured) else [])
    width = 0.8 / len(bars)
    for i, (key, color) in enumerate(bars):
        offset = (i - (len(bars) - 1) / 2) * width
        ax.bar([x + offset for x in xs], [r.get(key) or 0.0 for r in measured], width=width,
               color=color, label=key.replace(" samples/s", ""))
    for x, r in zip(xs, measured):
        if r.get("share"):
            ax.annotate(r["share"], (x, r["sustained samples/s"]), ha="center",
                        va="bottom", fontsize=8)
    on_cpu = any(r.get("timer") == "host wall" for r in measured)
    if measured:
        ax.set_xticks(list(xs), [r["strategy"] for r in measured], rotation=25)
        ax.legend()
    ax.set_ylabel("samples per second")
    ax.set_title("sustained over the run against the GPU's own rate" +
                 (f"\n({CPU_NOTE})" if on_cpu else ""))
    _headline(fig, where)
    _save(plt, fig, path, dpi=110)


def step_times_chart(runs: list[tuple[str, list[dict]]], path: Path, where: str) -> None:
    """Each run's step times over the run (summary.json's step_times; the device's clock
    where there is one, else the host's), one line per run: the steps a user sees, the
    slow ones included. The y axis stops at five times the slowest run's median, so that
    one very slow step (a compile, the trace's write) does not flatten the rest; steps
    above it are drawn at the top edge."""
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(9, 4.5))
    timed = [(name, _step_ms(times)) for name, times in runs]
    timed = [(name, ms) for name, ms in timed if ms]
    if not timed:
        _no_runs(ax, "step times")
    medians = [sorted(v for _, v in ms)[len(ms) // 2] for _, ms in timed]
    top = 5 * max(medians) if medians else 1.0
    for name, ms in timed:
        ax.plot([s for s, _ in ms], [min(v, top) for _, v in ms], lw=0.8, label=name)
    on_cpu = any(t["device_ms"] is None for _, times in runs for t in times[1:])
    if timed:
        ax.set_ylim(0, top * 1.02)
        ax.legend(fontsize=8)
    ax.set_xlabel("step")
    ax.set_ylabel("ms per step (device)" if not on_cpu else "ms per step (host wall)")
    ax.set_title("every step of each run" + (f"\n({CPU_NOTE})" if on_cpu else ""))
    _headline(fig, where)
    _save(plt, fig, path, dpi=110)


def _step_ms(times: list[dict]) -> list[tuple[int, float]]:
    """(step number, ms) of a run's steps, by the device's clock where it has one."""
    on_device = any(t["device_ms"] is not None for t in times)
    key = "device_ms" if on_device else "host_ms"
    return [(i + 1, t[key]) for i, t in enumerate(times) if t[key] is not None]


MEAN_STYLES = ("-", (0, (5, 3)), (0, (1, 2)), (0, (6, 2, 1, 2)))


def loss_curves_chart(runs: list[tuple[str, list[float]]], path: Path, where: str,
                      window: int = 25) -> None:
    """Runs' losses step by step (summary.json's losses) in one panel, and below it each
    run's relative difference from the first run, step by step and as a mean over
    `window` steps: a change of maths (--float8-lin1) against the step it replaces, the
    same seed and batches."""
    plt = _pyplot()
    fig, (top, bottom) = plt.subplots(2, 1, figsize=(9, 6.5), sharex=True,
                                      gridspec_kw={"height_ratios": [3, 2]})
    if not runs:
        _no_runs(top, "losses")
    for name, losses in runs:
        top.plot(range(1, len(losses) + 1), losses, lw=0.6, label=name)
    base_name, base = runs[0] if runs else ("", [])
    for k, (name, losses) in enumerate(runs[1:]):
        rel = [(y - x) / abs(x) * 100 for x, y in zip(base, losses) if x]
        mean = [sum(rel[i:i + window]) / len(rel[i:i + window]) for i in range(len(rel))]
        line, = bottom.plot(range(1, len(rel) + 1), rel, lw=0.4, alpha=0.5)
        # A style each: two runs' means that coincide (float8 on two strategies) hid the
        # first under the second; dashes let the one beneath show through.
        bottom.plot(range(1, len(mean) + 1), mean, lw=1.2, color=line.get_color(),
                    ls=MEAN_STYLES[k % len(MEAN_STYLES)],
                    label=f"{name} − {base_name} (mean of {window} steps)")
    bottom.axhline(0, color="grey", lw=0.6)
    top.set_ylabel("loss")
    top.set_title("the loss at every step" + (" (a curve may hide another: their differences "
                                              "below)" if runs[1:] else ""))
    if runs:
        top.legend(fontsize=8)
    if runs[1:]:
        bottom.legend(fontsize=8)
    bottom.set_ylabel("% of the first run's loss")
    bottom.set_xlabel("step")
    _headline(fig, where)
    _save(plt, fig, path, dpi=110)
