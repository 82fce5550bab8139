"""Where a profiled step's GPU sits idle: per step, the span from its first GPU activity to
its last, the busy time inside it, and the longest idle gaps with the activities around
them. For a step whose wall time exceeds its GPU time (a CUDA graph run, say).

    python3 bench/step_gaps.py profiles/<run> | <trace file> [--gaps 5]
"""

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from profiling.trace_events import (  # noqa: E402
    GPU_CATS,
    Windows,
    command_trace,
    host_ranges,
    launchers,
    load_trace,
)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path, help="a run folder or a trace file")
    parser.add_argument("--gaps", type=int, default=5)
    args = parser.parse_args(argv)
    trace = command_trace(args.run)
    if trace is None:
        return 2
    events = load_trace(trace)
    steps = Windows(host_ranges(events, ())[1])
    step_of = {corr: step for corr, (_, step) in launchers(events, Windows([]), steps).items()}
    by_step = {}
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            step = step_of.get(e.get("args", {}).get("correlation"))
            if step:
                by_step.setdefault(step, []).append(
                    (float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"]))
    for start, end, name in steps.ranges:
        acts = sorted(by_step.get(name, []))
        if not acts:
            continue
        busy, gaps, last_end, last_name = 0.0, [], acts[0][0], "(start)"
        for s, e, n in acts:
            if s > last_end:
                gaps.append((s - last_end, last_name, n))
            busy += max(0.0, e - max(s, last_end))
            if e > last_end:
                last_end, last_name = e, n
        first = (acts[0][0] - start) / 1e3
        print(f"{name}: wall {(end - start) / 1e3:.2f} ms; GPU from +{first:.2f}"
              f" to +{(last_end - start) / 1e3:.2f} ms, busy {busy / 1e3:.2f} ms, "
              f"{len(acts)} activities")
        for gap, before, after in sorted(gaps, reverse=True)[:args.gaps]:
            print(f"    idle {gap / 1e3:7.3f} ms after {before[:70]}  before {after[:70]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
