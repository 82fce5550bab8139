"""Per-phase numbers from a torch.profiler Chrome trace: the single source of every table.

Why the trace file and not key_averages(): on CUDA runs with torch 2.11, key_averages()
has two rows per record_function name (a CPU one, and a GPU-annotation one whose CPU time
is 0); a table built from the wrong row prints zeros. The trace has every event with its
category, so each number here is defined once:

- phase CPU time: wall duration of the phase's `user_annotation` range on the host;
- phase GPU time: summed durations of the kernels, memcpys and memsets whose launching
  runtime/driver call falls inside the phase's time window (any thread: the backward runs
  on autograd's device thread while the main thread waits inside the 'backward' range);
- launches: runtime/driver launch calls in the window (cudaLaunchKernel, cuLaunchKernel...);
- H2D copies: host-to-device memcpy activities launched in the window;
- syncs: runtime calls that block the host on the device (…Synchronize, blocking memcpy);
- step time: the `ProfilerStep#N` range's wall duration; GPU busy time of a step likewise;
- top kernels: the GPU activities of the profiled steps by name, their time and count per
  step (what a CUDA graph's replay spends, whose phases are not separate ranges).
All per-step numbers are means over the profiled (active) steps; cpu_ms_each lists each
step's CPU time of a phase (and of the step), so that one slow step is visible.
"""

import bisect
import gzip
import json
from collections import defaultdict
from pathlib import Path

RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "Runtime", "driver"}
GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
SYNC_NAMES = ("Synchronize",)
TOP_KERNELS = 15        # kernels listed in a summary, by GPU time
TOP_NAME_CHARS = 1000   # template names of kernels can be longer; cut there
BLOCKING_COPIES = {"cudaMemcpy", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cuMemcpy"}


def load_trace(path: Path) -> list[dict]:
    opener = gzip.open if str(path).endswith(".gz") else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def profiler_events(prof) -> list[dict]:
    """The events of a finished torch.profiler profile, as load_trace reads them from a
    trace file (written to a temporary one: the profiler's only export of them)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return load_trace(path)


def _is_launch(name: str) -> bool:
    return "LaunchKernel" in name or "LaunchCooperativeKernel" in name or \
        name in {"cudaGraphLaunch", "cuGraphLaunch"}


def _is_sync(name: str) -> bool:
    return any(s in name for s in SYNC_NAMES) or name in BLOCKING_COPIES


def _is_h2d(event: dict) -> bool:
    name = event.get("name", "")
    kind = str(event.get("args", {}).get("kind", ""))
    return "HtoD" in name or "HtoD" in kind or "Host -> Device" in name


class _Windows:
    """The phase ranges (or the step ranges) of the host, to find which holds a timestamp."""

    def __init__(self, ranges: list[tuple[float, float, str]]):
        self.ranges = sorted(ranges)
        self.starts = [r[0] for r in self.ranges]

    def find(self, ts: float) -> str | None:
        # Ranges of one kind never overlap, so the last one starting at or before ts is
        # the only candidate (a loop trace has ~10^5 launches: no linear scan per event).
        i = bisect.bisect_right(self.starts, ts) - 1
        if i >= 0 and ts <= self.ranges[i][1]:
            return self.ranges[i][2]
        return None


def host_ranges(events: list[dict], phases: tuple[str, ...], max_steps: int | None = None):
    """(phase ranges, step ranges) of the host, each (start, end, name) in microseconds.
    max_steps keeps only the first steps (a run that ended early: its last, unfinished
    step is left out) and the phases inside them."""
    phase_ranges, step_ranges = [], []
    for e in events:
        if e.get("ph") != "X" or e.get("cat") != "user_annotation":
            continue
        start, end = float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0))
        if e["name"] in phases:
            phase_ranges.append((start, end, e["name"]))
        elif e["name"].startswith("ProfilerStep#"):
            step_ranges.append((start, end, e["name"]))
    if max_steps is not None:
        step_ranges = sorted(step_ranges)[:max_steps]
        inside = _Windows(step_ranges)
        phase_ranges = [r for r in phase_ranges if inside.find(r[0]) is not None]
    return phase_ranges, step_ranges


def launchers(events: list[dict], phase_of: _Windows, step_of: _Windows):
    """correlation id -> (phase, step) of the runtime call that launched it (None where the
    call was outside every phase or step)."""
    found = {}
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in RUNTIME_CATS:
            continue
        corr = e.get("args", {}).get("correlation")
        if corr is not None:
            ts = float(e["ts"])
            found[corr] = (phase_of.find(ts), step_of.find(ts))
    return found


def summarize(events: list[dict], phases: tuple[str, ...], max_steps: int | None = None) -> dict:
    """Per-phase means over the profiled steps, and the step time. max_steps keeps only
    the first steps (a run that ended early: its last, unfinished step is left out)."""
    phase_ranges, step_ranges = host_ranges(events, phases, max_steps)
    steps = max(len(step_ranges), 1)
    phase_of, step_of = _Windows(phase_ranges), _Windows(step_ranges)

    stats = {p: defaultdict(float) for p in phases}
    cpu_per_step = {p: [] for p in phases}  # each occurrence, in order: outliers show here
    step_gpu = defaultdict(float)
    by_name = defaultdict(lambda: [0.0, 0])  # kernel name -> [microseconds, calls]
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
        if _is_launch(name):
            stats[phase]["launches"] += 1
        if _is_sync(name):
            stats[phase]["syncs"] += 1
    for e in events:
        if e.get("ph") != "X" or e.get("cat") not in GPU_CATS:
            continue
        corr = e.get("args", {}).get("correlation")
        dur = float(e.get("dur", 0))
        if launcher_step.get(corr) is not None:
            step_gpu[launcher_step[corr]] += dur
            kernel = by_name[e.get("name", "?")[:TOP_NAME_CHARS]]
            kernel[0] += dur
            kernel[1] += 1
        phase = launcher_phase.get(corr)
        if phase is None:
            continue
        stats[phase]["gpu_us"] += dur
        if e.get("cat") in {"gpu_memcpy", "Memcpy"} and _is_h2d(e):
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
    }
    top = sorted(by_name.items(), key=lambda kv: -kv[1][0])[:TOP_KERNELS]
    result["top_kernels"] = [{"name": n, "gpu_ms": us / steps / 1e3, "calls": calls / steps}
                             for n, (us, calls) in top]
    return result


def find_trace(run_dir: Path, worker: str = "*") -> Path:
    """The (last) trace of a run folder, or of one worker's (one rank's) in it."""
    traces = sorted(Path(run_dir).glob(f"{worker}.*pt.trace.json*"))
    if not traces:
        raise FileNotFoundError(f"no profiler trace ({worker}.*.pt.trace.json[.gz]) in "
                                f"{run_dir}")
    return traces[-1]
