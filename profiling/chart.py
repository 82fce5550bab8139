"""The comparison's chart: the loss's cost in forward mode, the step's in train mode."""

from pathlib import Path


def _no_runs(ax, title: str) -> None:
    ax.set_axis_off()
    ax.text(0.5, 0.5, f"{title}\n\nno measured runs", ha="center", va="center",
            transform=ax.transAxes)


def loss_chart(rows: list[dict], path: Path) -> None:
    """Left: the loss range's CPU time in forward mode (the original's figure), log scale.
    Right: the train step's GPU and CPU time per strategy. The step, not the loss: with a
    CUDA graph the loss is inside one replay, and a strategy's host cost shows as CPU time
    above the GPU time."""
    import matplotlib
    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4.5))
    title = "forward mode: loss range, CPU ms/step"
    measured = [r for r in rows if r["mode"] == "forward" and r.get("loss CPU ms") is not None]
    if measured:
        values = [r["loss CPU ms"] for r in measured]
        left.bar([r["strategy"] for r in measured], values, color="#4c72b0")
        if min(values) > 0:
            left.set_yscale("log")
        for x, v in enumerate(values):
            left.annotate(f"{v:.3g}", (x, v), ha="center", va="bottom", fontsize=8)
        left.set_title(title)
        left.set_ylabel("ms per step")
        left.tick_params(axis="x", rotation=35)
    else:
        _no_runs(left, title)

    title = "train mode: step GPU and CPU ms/step"
    measured = [r for r in rows if r["mode"] == "train" and r.get("step CPU ms") is not None]
    if measured:
        xs = range(len(measured))
        for offset, key, color in ((-0.2, "step GPU ms", "#4c72b0"),
                                   (0.2, "step CPU ms", "#dd8452")):
            values = [r.get(key) or 0.0 for r in measured]
            right.bar([x + offset for x in xs], values, width=0.4, color=color,
                      label=key.replace(" ms", ""))
            for x, v in zip(xs, values):
                if v:
                    right.annotate(f"{v:.3g}", (x + offset, v), ha="center", va="bottom",
                                   fontsize=7)
        right.set_xticks(list(xs), [r["strategy"] + (" (graph)" if r.get("CUDA graph") == "yes"
                                                     else "") for r in measured])
        right.set_yscale("log")
        right.legend()
        right.set_title(title)
        right.set_ylabel("ms per step")
        right.tick_params(axis="x", rotation=35)
    else:
        _no_runs(right, title)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
