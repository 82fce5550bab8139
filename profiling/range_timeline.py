"""What the host does inside one profiler range, step by step: where a range's CPU time goes.

    python3 -m profiling.range_timeline profiles/<run> [--range loss] [--steps 2]

For each of the last --steps occurrences of the range, one line per host event inside it
(operators, runtime and driver calls, nested ranges): start offset and duration in us.
The gaps between them are Python and dispatch time, which the trace does not name.
Events of other threads that fall inside the range's time say which thread they ran on:
the autograd engine's (the work of a backward range) or another's (the loader's pin-memory
thread, which is not the range's work at all).
"""

import argparse
import sys
from pathlib import Path

from profiling.trace_events import RUNTIME_CATS, command_trace, load_trace

HOST_CATS = {"cpu_op", "user_annotation", "python_function"} | RUNTIME_CATS


def range_events(events: list[dict], name: str) -> list[tuple[dict, list[dict]]]:
    """Each host range called `name`, with the host events that start inside it, in order."""
    ranges = sorted((e for e in events if e.get("ph") == "X" and e.get("name") == name
                     and e.get("cat") == "user_annotation"), key=lambda e: e["ts"])
    host = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in HOST_CATS),
                  key=lambda e: e["ts"])
    out = []
    for r in ranges:
        start, end = float(r["ts"]), float(r["ts"]) + float(r.get("dur", 0))
        inside = [e for e in host if start <= float(e["ts"]) <= end and e is not r]
        out.append((r, inside))
    return out


def format_timeline(r: dict, inside: list[dict]) -> str:
    start = float(r["ts"])
    lines = [f"{r['name']}: {float(r.get('dur', 0)):.1f} us"]
    for e in inside:
        thread = f"  [thread {e.get('tid')}]" if e.get("tid") != r.get("tid") else ""
        lines.append(f"  +{float(e['ts']) - start:8.1f} {float(e.get('dur', 0)):8.1f}  "
                     f"{e.get('cat')}: {e.get('name', '')[:90]}{thread}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder or a trace file")
    parser.add_argument("--range", default="loss", help="the record_function name")
    parser.add_argument("--steps", type=int, default=2, help="how many occurrences, last first")
    args = parser.parse_args(argv)
    trace = command_trace(args.run)
    if trace is None:
        return 2
    found = range_events(load_trace(trace), args.range)
    if not found:
        print(f"error: no range named {args.range!r} in {trace}", file=sys.stderr)
        return 2
    for r, inside in found[-args.steps:]:
        print(format_timeline(r, inside))
    return 0


if __name__ == "__main__":
    sys.exit(main())
