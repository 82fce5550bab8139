"""Side-by-side table of several runs, from their summary.json files (never re-measured).

    python3 -m profiling.compare profiles/padded-train-... profiles/kernel-triton-train-...

Per run: each phase's CPU and GPU time per step, the loss's launches (forward and, in
train mode, backward), host-to-device copies and syncs per step, peak GPU memory, the step
time, and the loss's speed-up over the loop strategy when a loop run of the same mode is
among the inputs.
"""

import json
import sys
from pathlib import Path


def load_summary(path: Path) -> dict:
    path = Path(path)
    return json.loads((path / "summary.json" if path.is_dir() else path).read_text())


def label(summary: dict) -> str:
    cfg = summary["config"]
    fused = cfg["loss"] in ("kernel", "conditional")
    return f"{cfg['loss']}{'/' + cfg['kernel'] if fused else ''}"


def _loss_time(summary: dict, key: str) -> float:
    p = summary["phases"]
    return p["loss"][key] + p.get("loss_backward", {}).get(key, 0.0)


def compare_rows(summaries: list[dict]) -> list[dict]:
    loops = {s["config"]["mode"]: s for s in summaries if s["config"]["loss"] == "loop"}
    rows = []
    for s in summaries:
        p, mode = s["phases"], s["config"]["mode"]
        loop = loops.get(mode)
        row = {
            "strategy": label(s), "mode": mode, "profiled steps": s["steps"],
            **{f"{name} CPU ms": p[name]["cpu_ms"] for name in p},
            **{f"{name} GPU ms": p[name]["gpu_ms"] for name in p},
            "loss launches": p["loss"]["launches"],
            "loss bwd launches": p["loss_backward"]["launches"] if "loss_backward" in p else None,
            "H2D copies": sum(x["h2d_copies"] for x in p.values()),
            "syncs": sum(x["syncs"] for x in p.values()),
            "peak GPU GB": s.get("peak_gpu_memory_gb"),
            "step CPU ms": s["step"]["cpu_ms"], "step GPU ms": s["step"]["gpu_ms"],
            "loss speed-up vs loop (CPU)": (_loss_time(loop, "cpu_ms") / _loss_time(s, "cpu_ms")
                                            if loop else None),
        }
        rows.append(row)
    return rows


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) < 1000 else f"{value:.0f}"
    return str(value)


def to_markdown(rows: list[dict], columns: list[str] | None = None) -> str:
    columns = columns or list(dict.fromkeys(k for r in rows for k in r))
    lines = ["| " + " | ".join(columns) + " |",
             "|" + "|".join("---" if c in ("strategy", "mode") else "---:" for c in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(_cell(r.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def main(argv=None) -> int:
    paths = argv if argv is not None else sys.argv[1:]
    if not paths:
        print("usage: python3 -m profiling.compare RUN_DIR_OR_SUMMARY [...]", file=sys.stderr)
        return 2
    print(to_markdown(compare_rows([load_summary(Path(p)) for p in paths])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
