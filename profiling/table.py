"""The step-time table a run prints: per phase, CPU and GPU time per step, and counts."""


GRAPH_NOTE = ("CUDA graph: forward, loss, backward and optimizer are one replay, the 'graph' "
              "row; their own ranges are host code that a replay does not run, so they are "
              "not in the trace (summary.json's top kernels say where the graph's GPU time "
              "goes)")


CPU_NOTE = ("-: not measured here: without a GPU there are no GPU times, and no launches, "
            "H2D copies or device syncs to count")


def _ms(value: float, on_gpu: bool) -> str:
    return f"{value:10.3f}" if on_gpu or value else f"{'-':>10}"


def _count(value: float, width: int, on_gpu: bool) -> str:
    """A per-step count, or '-' on a CPU-only run, where the trace has none to count (a
    0.0 there would read as a measurement)."""
    return f"{value:{width}.1f}" if on_gpu else f"{'-':>{width}}"


def format_table(summary: dict, title: str, on_gpu: bool) -> str:
    """Markdown table; GPU times and counts read '-' on a CPU-only run, and a line says
    why."""
    lines = [f"### {title}", "",
             "| phase         |  CPU ms/step |  GPU ms/step | launches | H2D copies | syncs |",
             "|---------------|-------------:|-------------:|---------:|-----------:|------:|"]
    for name, p in summary["phases"].items():
        lines.append(f"| {name:<13} | {p['cpu_ms']:12.3f} | {_ms(p['gpu_ms'], on_gpu):>12} "
                     f"| {_count(p['launches'], 8, on_gpu)} "
                     f"| {_count(p['h2d_copies'], 10, on_gpu)} "
                     f"| {_count(p['syncs'], 5, on_gpu)} |")
    step = summary["step"]
    lines.append(f"| **step**      | {step['cpu_ms']:12.3f} | {_ms(step['gpu_ms'], on_gpu):>12} "
                 f"|          |            |       |")
    lines.append("")
    lines.append(f"mean over {summary['steps']} profiled steps")
    if not on_gpu:
        lines.append(CPU_NOTE)
    if "graph" in summary["phases"]:
        lines.append(GRAPH_NOTE)
    return "\n".join(lines)
