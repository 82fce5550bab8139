"""A rank's communication a step, from its trace: the NCCL kernels' time, the part that
ran beside computation and the part the GPU spent on it alone (comm, overlapped, exposed,
by phase). Its design in full: docs/design.md."""

from collections import defaultdict

from profiling.trace_events import GPU_CATS, Windows, host_ranges, launchers


def is_collective_kernel(name: str) -> bool:
    return name.startswith("nccl")


def merge(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
    """Sorted, non-overlapping intervals covering the same time."""
    merged: list[list[float]] = []
    for start, end in sorted(intervals):
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    return [(a, b) for a, b in merged]


def length(intervals) -> float:
    return sum(end - start for start, end in intervals)


def intersection(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> float:
    """Total time two merged interval lists share."""
    i = j = 0
    shared = 0.0
    while i < len(a) and j < len(b):
        shared += max(0.0, min(a[i][1], b[j][1]) - max(a[i][0], b[j][0]))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return shared


def communication(events: list[dict], phases: tuple[str, ...],
                  max_steps: int | None = None) -> dict:
    """The rank's communication figures (see the module's docstring)."""
    phase_ranges, step_ranges = host_ranges(events, phases, max_steps)
    launched = launchers(events, Windows(phase_ranges), Windows(step_ranges))
    comm_by_step = defaultdict(list)
    by_phase = defaultdict(float)
    count = 0
    compute = []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in GPU_CATS:
            continue
        start = float(e["ts"])
        interval = (start, start + float(e.get("dur", 0)))
        if not is_collective_kernel(e.get("name", "")):
            compute.append(interval)
            continue
        phase, step = launched.get(e.get("args", {}).get("correlation"), (None, None))
        if step is None:
            continue
        comm_by_step[step].append(interval)
        by_phase[phase or "outside the phases"] += interval[1] - interval[0]
        count += 1
    compute = merge(compute)
    steps = max(len(step_ranges), 1)
    comm = overlapped = 0.0
    for intervals in comm_by_step.values():
        merged = merge(intervals)
        comm += length(merged)
        overlapped += intersection(merged, compute)
    return {
        "gpu": bool(count),
        "comm_ms": comm / steps / 1e3,
        "overlapped_ms": overlapped / steps / 1e3,
        "exposed_ms": (comm - overlapped) / steps / 1e3,
        "by_phase_ms": {p: us / steps / 1e3 for p, us in sorted(by_phase.items())},
        "collectives": count / steps,
    }


def idle_by_stream(events: list[dict]) -> dict:
    """Each GPU stream's idle time (µs) between its first and last activity (kernels,
    copies, memsets) in the trace: its span less the union of its activities. The sum of
    HolisticTraceAnalysis's idle-time breakdown of a stream (host wait, kernel wait,
    other), which tests/profiling/test_hta.py checks it against."""
    by_stream = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            start = float(e["ts"])
            by_stream[e.get("args", {}).get("stream")].append((start, start + float(e["dur"])))
    idle = {}
    for stream, intervals in by_stream.items():
        merged = merge(intervals)
        idle[stream] = merged[-1][1] - merged[0][0] - length(merged)
    return idle
