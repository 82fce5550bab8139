"""One table of one-GPU and several-GPU runs (bench/device_session.sh scaling): per run the
ranks, DDP knobs, step wall and GPU time on rank 0, NCCL time per step (overlapped and
exposed), samples per second and the scaling against its --scaling-baseline.

    python3 bench/scaling_table.py profiles/scaling-device/*
"""

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from core.names import describe  # noqa: E402
from profiling.scaling import samples_per_s  # noqa: E402


def row(folder: Path) -> str:
    s = json.loads((folder / "summary.json").read_text())
    job = s.get("distributed")
    world = job["world"] if job else 1
    knobs = ", ".join(f"{k}={v}" for k, v in s.get("ddp", {}).items()) if job else "-"
    comm = job["ranks"][0]["communication"] if job else None
    scale = job.get("scaling") if job else None
    cells = [folder.name, str(world), describe(s["config"]["loss"], s["config"]["backend"]),
             knobs, f"{s['step']['cpu_ms']:.2f}",
             f"{sorted(s['step']['cpu_ms_each'])[len(s['step']['cpu_ms_each']) // 2]:.2f}",
             f"{s['step']['gpu_ms']:.2f}",
             f"{comm['comm_ms']:.2f}" if comm else "-",
             f"{comm['overlapped_ms']:.2f}" if comm else "-",
             f"{comm['exposed_ms']:.2f}" if comm else "-",
             f"{samples_per_s(s):.0f}",
             f"{scale['factor']:.2f}x" if scale else "-",
             f"{s['peak_gpu_memory_gb']:.1f}" if s.get("peak_gpu_memory_gb") else "-"]
    return "| " + " | ".join(cells) + " |"


def main(folders: list[str]) -> None:
    print("| run | GPUs | loss | DDP knobs | step ms (mean) | step ms (median) | step GPU ms | "
          "NCCL ms | overlapped | exposed | samples/s | scaling | peak GB |")
    print("|---|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    for folder in map(Path, folders):
        if (folder / "summary.json").exists():
            try:
                print(row(folder))
            except (KeyError, ValueError) as exc:
                print(f"| {folder.name} | could not read: {exc!r} |")
        else:
            print(f"| {folder.name} | no summary.json (the run failed) |")


if __name__ == "__main__":
    main(sys.argv[1:])
