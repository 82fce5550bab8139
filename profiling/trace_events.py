"""A torch.profiler Chrome trace as events, and what each kind of event is (a launch, a
sync, an H2D copy, a device op's host range): the definitions every figure of this
project is built on. The design in full: docs/design.md, this module's section."""

import bisect
import errno
import gzip
import json
import os
import shutil
import sys
from pathlib import Path

RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "runtime", "Runtime", "driver"}
GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
SYNC_NAMES = ("Synchronize",)
BLOCKING_COPIES = {"cudaMemcpy", "cuMemcpyDtoH_v2", "cuMemcpyHtoD_v2", "cuMemcpy"}


def quiet_cpu_profiler() -> None:
    """Without a GPU, libkineto (torch 2.13's CPU build) prints 'USDT: ... profiler_start'
    and '... profiler_stop' on stderr for every profile: noise a newcomer reads as a
    problem. Its log threshold above USDT (5) hides them; libkineto reads it once, when
    the first profile starts, so this must come before that. Not on a GPU: the same
    threshold would hide CUPTI's errors. KINETO_LOG_LEVEL set by the user wins."""
    os.environ.setdefault("KINETO_LOG_LEVEL", "6")


# Below this much free space a trace that does not parse was cut short by a full disk:
# the profiler's writer (C++) stops at ENOSPC without raising.
FULL_DISK_BYTES = 1 << 20


def load_trace(path: Path) -> list[dict]:
    """A trace's events. A trace cut short on a full disk is an OSError ENOSPC naming the
    file (a JSON error at 'line 101782' says nothing of the cause)."""
    opener = gzip.open if str(path).endswith(".gz") else open
    try:
        with opener(path, "rt") as f:
            data = json.load(f)
    except (ValueError, EOFError) as exc:  # JSON or gzip cut short
        free = shutil.disk_usage(Path(path).parent).free
        if free < FULL_DISK_BYTES:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path)) from exc
        raise
    return data["traceEvents"] if isinstance(data, dict) else data


def find_trace(run_dir: Path, worker: str = "*") -> Path:
    """The (last) trace of a run folder, or of one worker's (one rank's) in it."""
    traces = sorted(Path(run_dir).glob(f"{worker}.*pt.trace.json*"))
    if not traces:
        raise FileNotFoundError(f"no profiler trace ({worker}.*.pt.trace.json[.gz]) in "
                                f"{run_dir}")
    return traces[-1]


def command_trace(run: Path) -> Path | None:
    """A command's trace argument: `run` itself where it is a file, else the trace in the
    run folder; None, after 'error: ...' on stderr, where there is none (exit 2 then)."""
    try:
        return run if run.is_file() else find_trace(run)
    except FileNotFoundError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return None


def profiler_events(prof) -> list[dict]:
    """The events of a finished torch.profiler profile, as load_trace reads them from a
    trace file (written to a temporary one: the profiler's only export of them)."""
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        return load_trace(path)


def is_launch(name: str) -> bool:
    return "LaunchKernel" in name or "LaunchCooperativeKernel" in name or \
        name in {"cudaGraphLaunch", "cuGraphLaunch"}


def is_sync(name: str) -> bool:
    return any(s in name for s in SYNC_NAMES) or name in BLOCKING_COPIES


def is_h2d(event: dict) -> bool:
    name = event.get("name", "")
    kind = str(event.get("args", {}).get("kind", ""))
    return "HtoD" in name or "HtoD" in kind or "Host -> Device" in name


class Windows:
    """Host ranges of one kind (phases, or steps), to find which holds a timestamp."""

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
        inside = Windows(step_ranges)
        phase_ranges = [r for r in phase_ranges if inside.find(r[0]) is not None]
    return phase_ranges, step_ranges


def launchers(events: list[dict], phase_of: Windows, step_of: Windows):
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
