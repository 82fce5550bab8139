"""What torch.compile did during a run, in its own words: how long it compiled, how many
graphs, recompiles and graph breaks, and the guard that failed for each recompile.

Why: the targets' shapes change every batch, and a graph specialised on a shape is
compiled again when it changes. Dynamo's metrics and counters are process-wide (make
compare runs many runs in one process), so a run takes what was added since its start
(begin()). The design in full: docs/design.md, this module's section."""

import os
from collections import Counter

TRACE_ENV = "TORCH_TRACE"


def _metrics() -> list:
    try:
        from torch._dynamo.utils import get_compilation_metrics
    except ImportError:
        return []
    return list(get_compilation_metrics())


def _counts() -> tuple[int, Counter]:
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"], Counter(counters["graph_break"])


def begin() -> dict:
    """The compiler's state at a run's start."""
    graphs, breaks = _counts()
    return {"seen": {id(m) for m in _metrics()}, "graphs": graphs, "breaks": breaks}


def _attempt(compile_id: str | None) -> int:
    """'0/1' -> 1: the frame's second compile, a recompile. Newer ids may add a suffix."""
    try:
        return int(str(compile_id).split("/")[1].split("_")[0])
    except (IndexError, ValueError):
        return 0


def account(since: dict, first_steps_ms: float | None) -> dict | None:
    """What was compiled since `since` (begin()); None where nothing was. first_steps_ms:
    the host time of the steps before the sustained rate's, where the compiling falls."""
    new = [m for m in _metrics() if id(m) not in since["seen"]]
    graphs, breaks = _counts()
    graphs -= since["graphs"]
    breaks = breaks - since["breaks"]
    if not new and not graphs:
        return None
    forward = [m for m in new if getattr(m, "entire_frame_compile_time_s", None) is not None]
    seconds = sum(m.entire_frame_compile_time_s for m in forward) + sum(
        (getattr(m, "backward_cumulative_compile_time_us", None) or 0) / 1e6 for m in new)
    reasons = Counter(m.recompile_reason.strip() for m in forward
                      if _attempt(m.compile_id) > 0 and getattr(m, "recompile_reason", None))
    result = {"compile_s": seconds, "frames_compiled": len(forward), "graphs": graphs,
              "recompiles": sum(1 for m in forward if _attempt(m.compile_id) > 0),
              "recompile_reasons": dict(reasons),
              "graph_breaks": sum(breaks.values()),
              "graph_break_reasons": {_break(reason): n for reason, n in breaks.items()}}
    if first_steps_ms:
        result["first_steps_ms"] = first_steps_ms
        result["first_steps_running_ms"] = max(0.0, first_steps_ms - seconds * 1e3)
    return result


def _break(reason: str) -> str:
    """A graph break's reason in a line: its first, and the explanation newer torches put
    on the next ('Failed to trace builtin operator: ... `print` ...')."""
    lines = [line.strip() for line in reason.splitlines() if line.strip()]
    explained = [line.removeprefix("Explanation:").strip() for line in lines[1:2]
                 if line.startswith("Explanation:")]
    return ": ".join(lines[:1] + explained)


def _line(reason: str) -> str:
    return " ".join(reason.splitlines()[0].split())


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def describe(acc: dict, settle: int) -> str:
    """The footer's lines."""
    line = (f"compile: {acc['compile_s']:.1f} s, {_count(acc['graphs'], 'graph')} from "
            f"{_count(acc['frames_compiled'], 'frame')}, "
            f"{_count(acc['recompiles'], 'recompile')}, "
            f"{_count(acc['graph_breaks'], 'graph break')} over the run")
    if "first_steps_ms" in acc:
        line += (f"; the first {settle} steps took {acc['first_steps_ms'] / 1e3:.1f} s "
                 f"({acc['compile_s']:.1f} s compiling, "
                 f"{acc['first_steps_running_ms'] / 1e3:.1f} s running)")
    lines = [line]
    lines += [f"  recompiled ({n}x): {_line(reason)}"
              for reason, n in acc["recompile_reasons"].items()]
    lines += [f"  graph break ({n}x): {reason}"
              for reason, n in acc["graph_break_reasons"].items()]
    return "\n".join(lines)


def trace_to(folder: str) -> None:
    """Dynamo's structured log (tlparse's input) into `folder`. torch reads TORCH_TRACE
    once, at import, into a handler that removes itself at the first event when it was
    unset: for a torch already imported (train.py imports it before parsing; make compare
    runs many runs), the handler is pointed at the folder and put back."""
    os.makedirs(folder, exist_ok=True)
    os.environ[TRACE_ENV] = folder
    import sys
    internal = sys.modules.get("torch._logging._internal")
    handler = getattr(internal, "LOG_TRACE_HANDLER", None)
    if handler is None:
        return  # not imported yet: it reads TORCH_TRACE
    if handler.stream is None or handler.root_dir != folder:
        handler.close()  # a log of an earlier run stays whole where it was
        handler.root_dir, handler.stream = folder, None
    if handler not in internal.trace_log.handlers:
        internal.trace_log.addHandler(handler)
