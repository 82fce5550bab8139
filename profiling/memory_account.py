"""Where a run's GPU memory goes over its profiled steps (train.py --memory-snapshot).

Two records of the same steps: the allocator's snapshot (every block, with its Python
stack, not what a tensor is for) and the profiler's memory timeline (what each tensor is
for: parameters, gradients, optimizer state, activations...). The snapshot's peak is
replayed from its trace. The calls and the replay: docs/design.md, this module's
section."""

import pickle
from pathlib import Path

SNAPSHOT = "memory_snapshot.pickle"
TIMELINE = "memory_timeline.json"  # by_category's, for a reader's own plots

# Enough for the GPU preset's profiled window (807 entries for 5 steps, f8d5dca); past it
# the allocator's ring drops the oldest, and the account says the window was cut.
MAX_ENTRIES = 1_000_000

# torch.profiler._memory_profiler's categories, as the footer and the page name them.
NAMES = {"PARAMETER": "parameters", "OPTIMIZER_STATE": "optimizer state",
         "GRADIENT": "gradients", "ACTIVATION": "activations", "TEMPORARY": "temporaries",
         "INPUT": "inputs", "AUTOGRAD_DETAIL": "autograd detail", None: "unknown"}


class AllocatorHistory:
    """The CUDA caching allocator's history between start() and stop(), written to path."""

    def __init__(self, path: Path):
        self.path = path
        self.recording = False
        self.peak_before = 0  # the run's peak before the window (the run's own peak)
        self.result: dict | None = None

    def start(self) -> None:
        import torch
        self.peak_before = torch.cuda.max_memory_allocated()
        torch.cuda.reset_peak_memory_stats()  # the window's own peak, against the snapshot's
        torch.cuda.memory._record_memory_history(
            "all", context="all", stacks="python", max_entries=MAX_ENTRIES)
        self.recording = True

    def stop(self) -> dict:
        """The snapshot written, recording off; its peak and the allocator's own counter
        of the same window. Call after a sync: nothing of the window is still queued."""
        import torch
        window_peak = torch.cuda.max_memory_allocated()
        snapshot = torch.cuda.memory._snapshot()
        self.abandon()
        from core.files import whole
        with whole(self.path) as partial:
            partial.write_bytes(pickle.dumps(snapshot))
        device = torch.cuda.current_device()
        peak, entries = snapshot_peak(snapshot, device)
        self.result = {"snapshot": self.path.name, "snapshot_peak_bytes": peak,
                       "max_memory_allocated_bytes": window_peak, "trace_entries": entries,
                       "window_cut": entries >= MAX_ENTRIES}
        return self.result

    def abandon(self) -> None:
        """Recording off, nothing written (a run that ends early)."""
        if self.recording:
            import torch
            torch.cuda.memory._record_memory_history(None)
            self.recording = False

    def run_peak(self) -> int:
        """The run's peak allocated bytes, the window's reset notwithstanding."""
        import torch
        return max(self.peak_before, torch.cuda.max_memory_allocated())


def snapshot_peak(snapshot: dict, device: int) -> tuple[int, int]:
    """(the most bytes requested and not yet freed at any moment of the snapshot's trace,
    its entries) on one device: replayed backward from the blocks allocated at the end,
    then forward."""
    now = sum(block.get("requested_size", block["size"])
              for seg in snapshot["segments"] if seg["device"] == device
              for block in seg["blocks"] if block["state"] == "active_allocated")
    trace = snapshot["device_traces"][device]
    deltas = [e["size"] if e["action"] == "alloc" else -e["size"]
              for e in trace if e["action"] in ("alloc", "free_requested")]
    level = now - sum(deltas)  # at the window's start
    peak = level
    for delta in deltas:
        level += delta
        peak = max(peak, level)
    return peak, len(trace)


def by_category(prof, device: str) -> dict:
    """torch.profiler's memory timeline on one device ("cuda:0", "cpu"), by category:
    {"times_us": [...], "bytes": {name: [...]}} (a profile made with profile_memory,
    record_shapes and with_stack). Private API of torch.profiler (stable since torch 2.1;
    its public export writes only a PNG in HTML, or a file)."""
    from torch.profiler._memory_profiler import _CATEGORY_TO_INDEX, MemoryProfileTimeline
    times, sizes = MemoryProfileTimeline(prof._memory_profile())._coalesce_timeline(device)
    # Each row of sizes: a leading 0, then one entry per category at its index + 1.
    columns = {NAMES[c.name if c is not None else None]: i + 1
               for c, i in _CATEGORY_TO_INDEX.items()}
    return {"times_us": list(times),
            "bytes": {name: [row[i] for row in sizes] for name, i in columns.items()}}


def totals(timeline: dict) -> list[int]:
    """The bytes of every category together at each point of the timeline."""
    return [sum(point) for point in zip(*timeline["bytes"].values())]


def peak_by_category(timeline: dict) -> dict:
    """At the moment the timeline's total is highest: its time (ms from the first point),
    the total, and each category's bytes then."""
    times, by_name = timeline["times_us"], timeline["bytes"]
    if not times:
        return {"at_ms": None, "total_bytes": 0, "bytes": {name: 0 for name in by_name}}
    total = totals(timeline)
    i = max(range(len(times)), key=total.__getitem__)
    return {"at_ms": (times[i] - times[0]) / 1e3, "total_bytes": total[i],
            "bytes": {name: column[i] for name, column in by_name.items()}}


def account(history: dict | None, timeline: dict | None, page: str | None) -> dict:
    """summary.json's "memory": the snapshot's figures and the timeline's peak by
    category (either None where it was not recorded)."""
    return {"allocator": history,
            "peak_by_category": peak_by_category(timeline) if timeline else None,
            "page": page}


def describe(memory: dict) -> str:
    """The footer's lines: the peak by category, and the snapshot against the counter."""
    lines = []
    peak = memory["peak_by_category"]
    if peak:
        parts = ", ".join(f"{name} {size(b)}" for name, b in
                          sorted(peak["bytes"].items(), key=lambda kv: -kv[1]) if b)
        lines.append(f"memory at its peak over the profiled steps (torch.profiler's "
                     f"categories): {size(peak['total_bytes'])} at {peak['at_ms']:.1f} ms: "
                     f"{parts}")
    alloc = memory["allocator"]
    if alloc:
        cut = " (the window's start was cut: more entries than kept)" if alloc["window_cut"] else ""
        lines.append(f"allocator snapshot {alloc['snapshot']}: peak "
                     f"{size(alloc['snapshot_peak_bytes'])} over its "
                     f"{alloc['trace_entries']} entries{cut}; max_memory_allocated over the "
                     f"same steps {size(alloc['max_memory_allocated_bytes'])}")
    if memory["page"]:
        lines.append(f"memory by category: {memory['page']} (offline); the snapshot opens "
                     "in https://pytorch.org/memory_viz")
    return "\n".join(lines)


def size(n: int) -> str:
    """Bytes as a reader takes them in: 4 significant digits, in GB, MB or kB (1e3 steps,
    as the footer's other GB figures)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"
