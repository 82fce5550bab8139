"""Side-by-side rows of several runs, from their summary.json files (never re-measured);
make compare (studies/compare.py) runs the strategies and writes them out. Runs that
differ in more than strategy and mode (profiling/alike.py) still stand side by side, each
differing field a column and the table opening with a warning; the same run given twice is
refused. The design in full: docs/design.md, this module's section."""

from pathlib import Path

from core.errors import UserError
from core.files import read_json_object
from core.names import PHASES
from profiling import alike, flops
from profiling.trace_summary import step_device_ms
from training.speedups import maths_changed


def load_summary(path: Path, what: str = "a run's summary") -> dict:
    """A run folder's summary.json (or that file), one line if it is not a JSON object."""
    path = Path(path)
    return read_json_object(path / "summary.json" if path.is_dir() else path, what)


label = alike.strategy


def ran_on_gpu(summary: dict) -> bool:
    """Whether a run had a GPU (its GPU columns hold figures, not '-'): only a GPU run
    records a peak of GPU memory."""
    return summary.get("peak_gpu_memory_gb") is not None


def _loss_time(summary: dict, key: str) -> float | None:
    """The loss ranges' time; None for a CUDA-graph run, whose loss is inside the replay."""
    p = summary["phases"]
    if "loss" not in p:
        return None
    return p["loss"][key] + p.get("loss_backward", {}).get(key, 0.0)


COLUMNS = (["strategy", "mode", *alike.FIELDS, "profiled steps"]
           + [f"{p} {unit} ms" for p in PHASES for unit in ("CPU", "GPU")]
           + ["loss launches", "loss bwd launches", "H2D copies", "syncs", "peak GPU GB",
              "step CPU ms", "step GPU ms", *flops.COLUMNS, "loss speed-up vs loop", "CUDA graph",
              "maths", "run folder"])


def compare_rows(summaries: list[dict]) -> list[dict]:
    """One row per run. GPU columns are empty for a run without a GPU; the speed-up is
    the loop's host time in the loss ranges (loss + loss_backward) over this run's, in
    the same mode, when a loop run is among the inputs."""
    apart = alike.differing(summaries)
    loops = [s for s in summaries if s["config"]["loss"] == "loop"]
    rows = []
    for s in summaries:
        p, mode = s["phases"], s["config"]["mode"]
        on_gpu = ran_on_gpu(s)
        loop = next((x for x in loops if x["config"]["mode"] == mode
                     and not alike.differences(x, s, apart)), None)
        own_loss = _loss_time(s, "cpu_ms")
        fields = alike.fields_of(s)
        row = {"strategy": label(s), "mode": mode, **{f: fields[f] for f in apart},
               "profiled steps": s["steps"]}
        for name in PHASES:
            if name in p:
                row[f"{name} CPU ms"] = p[name]["cpu_ms"]
                row[f"{name} GPU ms"] = p[name]["gpu_ms"] if on_gpu else None
        row.update({
            "loss launches": p["loss"]["launches"] if on_gpu and "loss" in p else None,
            "loss bwd launches": p["loss_backward"]["launches"]
            if on_gpu and "loss_backward" in p else None,
            "H2D copies": sum(x["h2d_copies"] for x in p.values()) if on_gpu else None,
            "syncs": sum(x["syncs"] for x in p.values()) if on_gpu else None,
            "peak GPU GB": s.get("peak_gpu_memory_gb"),
            "step CPU ms": s["step"]["cpu_ms"],
            "step GPU ms": step_device_ms(s["step"]) if on_gpu else None,
            **flops.cells(s.get("flops")),
            # Summaries from before the speed-ups have no "speedups": no graph there.
            "CUDA graph": "yes" if (s.get("speedups") or {}).get("on", {}).get("cuda_graph")
            else "no",
            "loss speed-up vs loop": (_loss_time(loop, "cpu_ms") / own_loss
                                      if loop and own_loss else None),
            "maths": maths_changed((s.get("speedups") or {}).get("on", {})),
        })
        rows.append(row)
    return rows


def unlike_warning(summaries: list[dict]) -> str | None:
    """One line naming the fields in which the runs differ, or None if only strategy and
    mode do."""
    apart = alike.differing(summaries)
    if not apart:
        return None
    return (f"warning: these runs differ in {', '.join(apart)} (columns of their own): "
            "compare only rows alike in those")


def check_distinct(summaries: list[dict], paths: list) -> None:
    """The same run (strategy, mode and every field of profiling/alike.py) given twice is
    one line: a duplicated row would only look like a second measurement."""
    seen = {}
    for summary, path in zip(summaries, paths):
        key = (label(summary), summary["config"]["mode"], repr(alike.fields_of(summary)))
        if key in seen:
            raise UserError(f"{seen[key]} and {path} are the same kind of run ({key[0]}, "
                            f"{key[1]} mode, the same settings): give one of them")
        seen[key] = path


def skipped_row(strategy: str, mode: str, reason: str) -> dict:
    """A strategy that could not run here, listed with the reason."""
    return {"strategy": strategy, "mode": mode, "profiled steps": f"skipped: {reason}"}


def present_columns(rows: list[dict]) -> list[str]:
    """COLUMNS in their order, less those no row has (train-only phases in forward mode)."""
    return [c for c in COLUMNS if any(c in r for r in rows)]
