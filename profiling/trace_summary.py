"""Per-phase numbers from a torch.profiler Chrome trace: the single source of every table.

Why the trace file and not key_averages(): on CUDA runs with torch 2.11, key_averages()
has two rows per record_function name (a CPU one, and a GPU-annotation one whose CPU time
is 0); the trace has every event with its category, so each number here is defined once.
Each definition (a phase's CPU and GPU time, launches, copies, syncs, a step's GPU time
summed, on its busiest stream and as wall time): docs/design.md, this module's section."""

from collections import defaultdict

from profiling.communication import length, merge
from profiling.trace_events import (
    GPU_CATS,
    RUNTIME_CATS,
    Windows,
    host_ranges,
    is_h2d,
    is_launch,
    is_sync,
    launchers,
)

TOP_KERNELS = 15        # kernels listed in a summary, by GPU time
TOP_NAME_CHARS = 1000   # template names of kernels can be longer; cut there


def summarize(events: list[dict], phases: tuple[str, ...], max_steps: int | None = None) -> dict:
    """Per-phase means over the profiled steps, and the step time. max_steps keeps only
    the first steps (a run that ended early: its last, unfinished step is left out)."""
    phase_ranges, step_ranges = host_ranges(events, phases, max_steps)
    steps = max(len(step_ranges), 1)
    phase_of, step_of = Windows(phase_ranges), Windows(step_ranges)

    stats = {p: defaultdict(float) for p in phases}
    cpu_per_step = {p: [] for p in phases}  # each occurrence, in order: outliers show here
    step_gpu = defaultdict(float)
    step_stream = defaultdict(float)  # (step, stream) -> microseconds
    by_name = defaultdict(lambda: [0.0, 0])  # kernel name -> [microseconds, calls]
    intervals = []  # every GPU activity the steps launched: (start, end) microseconds
    stream_end = {}  # stream -> the end of its last activity (microseconds)
    first = {}  # (step, stream) -> the start of the first activity the step launched there
    for start, end, name in sorted(phase_ranges):
        stats[name]["cpu_us"] += end - start
        cpu_per_step[name].append(round((end - start) / 1e3, 4))
    launched = launchers(events, phase_of, step_of)
    launcher_phase = {corr: phase for corr, (phase, _) in launched.items()}
    launcher_step = {corr: step for corr, (_, step) in launched.items()}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in RUNTIME_CATS:
            continue
        name = e.get("name", "")
        phase = phase_of.find(float(e["ts"]))
        if phase is None:
            continue
        if is_launch(name):
            stats[phase]["launches"] += 1
        if is_sync(name):
            stats[phase]["syncs"] += 1
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in GPU_CATS:
            continue
        corr = e.get("args", {}).get("correlation")
        dur = float(e.get("dur", 0))
        if launcher_step.get(corr) is not None:
            stream, start = e.get("args", {}).get("stream"), float(e["ts"])
            step_gpu[launcher_step[corr]] += dur
            step_stream[launcher_step[corr], stream] += dur
            intervals.append((start, start + dur))
            stream_end[stream] = max(stream_end.get(stream, start), start + dur)
            key = (launcher_step[corr], stream)
            first[key] = min(first.get(key, start), start)
            kernel = by_name[e.get("name", "?")[:TOP_NAME_CHARS]]
            kernel[0] += dur
            kernel[1] += 1
        phase = launcher_phase.get(corr)
        if phase is None:
            continue
        stats[phase]["gpu_us"] += dur
        if e.get("cat") in {"gpu_memcpy", "Memcpy"} and is_h2d(e):
            stats[phase]["h2d_copies"] += 1

    result = {"steps": len(step_ranges), "phases": {}}
    for p in phases:
        s = stats[p]
        result["phases"][p] = {
            "cpu_ms": s["cpu_us"] / steps / 1e3,
            "cpu_ms_each": cpu_per_step[p],
            "gpu_ms": s["gpu_us"] / steps / 1e3,
            "launches": s["launches"] / steps,
            "h2d_copies": s["h2d_copies"] / steps,
            "syncs": s["syncs"] / steps,
        }
    result["step"] = {
        "cpu_ms": sum(e - s for s, e, _ in step_ranges) / steps / 1e3,
        "cpu_ms_each": [round((e - s) / 1e3, 4) for s, e, _ in sorted(step_ranges)],
        "gpu_ms": sum(step_gpu.values()) / steps / 1e3,
        "busiest_stream_ms": _busiest(step_stream) / steps / 1e3,
        "busy_ms": _busy(intervals, step_stream, stream_end, first, steps) / 1e3,
    }
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TOP_KERNELS]
    result["top_kernels"] = [{"name": n, "gpu_ms": us / steps / 1e3, "calls": calls / steps}
                             for n, (us, calls) in top]
    return result


GPU_FIELDS = {"phase": ("gpu_ms", "launches", "h2d_copies", "syncs"),
              "step": ("gpu_ms", "busiest_stream_ms", "busy_ms")}


def not_measured_on_a_cpu(summary: dict) -> dict:
    """The summary with every figure only a GPU gives set to None ("not measured", null
    in summary.json): a CPU's trace has no kernels, and its 0.0 read as a measured zero
    in the JSON and in TensorBoard's phase_gpu_ms scalars. top_kernels goes empty."""
    for phase in summary["phases"].values():
        phase.update(dict.fromkeys(GPU_FIELDS["phase"]))
    summary["step"].update(dict.fromkeys(GPU_FIELDS["step"]))
    summary["top_kernels"] = []
    return summary


def step_device_ms(step: dict, before: str = "gpu_ms") -> float:
    """A step's device time from its summary: busy_ms, or for a summary written before
    busy_ms existed, what the table read then (`before`: gpu_ms, which agrees with
    busy_ms where no two streams overlap, or busiest_stream_ms)."""
    return step.get("busy_ms", step[before])


def _busy(intervals: list, step_stream: dict, stream_end: dict, first: dict,
          steps: int) -> float:
    """A step's busy time (microseconds): the union of the steps' GPU activities over the
    periods between the compute stream's step starts (the stream of most GPU time), from
    the second step's to the last's; with fewer than three steps, the union up to the
    compute stream's last end over the steps."""
    if not intervals:
        return 0.0
    total = defaultdict(float)
    for (_step, stream), us in step_stream.items():
        total[stream] += us
    compute = max(total, key=total.get)
    starts = sorted(t for (_step, stream), t in first.items() if stream == compute)
    if len(starts) >= 3:
        lo, hi = starts[1], starts[-1]
        inside = [(max(a, lo), min(b, hi)) for a, b in intervals if a < hi and b > lo]
        return length(merge(inside)) / (len(starts) - 2)
    end = stream_end[compute]
    return length(merge([(a, min(b, end)) for a, b in intervals if a < end])) / steps


def _busiest(step_stream: dict) -> float:
    """The sum over steps of each step's busiest stream's GPU time (microseconds)."""
    busiest = defaultdict(float)
    for (step, _stream), us in step_stream.items():
        busiest[step] = max(busiest[step], us)
    return sum(busiest.values())
