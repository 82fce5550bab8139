"""The comparison's chart: the loss's cost per strategy, forward mode and train mode."""

from pathlib import Path


def loss_chart(rows: list[dict], path: Path) -> None:
    """Two log-scale bar charts: the loss range's CPU time in forward mode (the original's
    figure) and the loss's GPU time, forward plus backward, in train mode."""
    import matplotlib
    matplotlib.use("Agg")  # no display: write the file only
    import matplotlib.pyplot as plt

    panels = [("forward", "loss CPU ms", "forward mode: loss range, CPU ms/step"),
              ("train", None, "train mode: loss forward + backward, GPU ms/step")]
    fig, axes = plt.subplots(1, 2, figsize=(13, 4.5))
    for ax, (mode, key, title) in zip(axes, panels):
        value_key = key or "loss GPU ms"
        measured = [r for r in rows if r["mode"] == mode and r.get(value_key) is not None]
        names = [r["strategy"] for r in measured]
        if key:
            values = [r[key] for r in measured]
        else:
            values = [r["loss GPU ms"] + (r.get("loss_backward GPU ms") or 0) for r in measured]
        if not measured:
            ax.set_axis_off()
            ax.text(0.5, 0.5, f"{title}\n\nno measured runs (GPU times need a GPU)",
                    ha="center", va="center", transform=ax.transAxes)
            continue
        ax.bar(names, values, color="#4c72b0")
        if values and min(values) > 0:
            ax.set_yscale("log")
        ax.set_title(title)
        ax.set_ylabel("ms per step")
        ax.tick_params(axis="x", rotation=35)
        for x, v in enumerate(values):
            ax.annotate(f"{v:.3g}", (x, v), ha="center", va="bottom", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
