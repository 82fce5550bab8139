"""A job of several ranks in one summary: each rank's table and communication, samples
per second (the global batch over rank 0's step: the ranks wait for each other every
step), and the scaling against a one-GPU run, by sustained rates where both runs have
one. The design in full: docs/design.md, this module's section."""

from pathlib import Path

from core.errors import UserError
from core.files import read_json_object
from profiling import alike


def samples_per_s(summary: dict) -> float:
    """Samples a second of a run's summary.json (one process or several)."""
    world = summary.get("distributed", {}).get("world", 1)
    step_ms = summary["step"]["cpu_ms"]
    return summary["config"]["batch_size"] * world / (step_ms / 1e3) if step_ms else 0.0


def check_baseline(folder: str, config: dict | None = None) -> dict:
    """The summary of the one-GPU run a job is compared with; one line if it is not one,
    or (given the job's config) if it is not a run of the same strategy, mode and
    settings (profiling/alike.py; the device is checked when the job has run)."""
    summary = read_json_object(Path(folder) / "summary.json", "--scaling-baseline")
    if summary.get("status") != "complete":
        raise UserError(f"--scaling-baseline {folder} is not a complete run")
    if summary.get("distributed", {}).get("world", 1) != 1:
        raise UserError(f"--scaling-baseline {folder} ran on several ranks: give a one-GPU "
                        "run")
    if config is not None:
        job = {"config": config}
        diffs = {}
        if alike.strategy(summary) != alike.strategy(job):
            diffs["strategy"] = (alike.strategy(summary), alike.strategy(job))
        if summary["config"]["mode"] != config["mode"]:
            diffs["mode"] = (summary["config"]["mode"], config["mode"])
        diffs.update(alike.baseline_differences(summary, job))
        if diffs:
            raise UserError(f"--scaling-baseline {folder} is not this job's run on one GPU "
                            f"({alike.describe(diffs)}): give a one-GPU run of the same "
                            "strategy, mode and settings")
    return summary


def scaling(job: dict, baseline_folder: str) -> dict:
    """This job's samples a second over the one-GPU run's, and that over the ranks."""
    base = check_baseline(baseline_folder)
    mine, theirs, basis = _rates(job, base)
    factor = mine / theirs
    world = job["distributed"]["world"]
    same_batch = base["config"]["batch_size"] == job["config"]["batch_size"]
    return {"baseline": str(baseline_folder), "baseline_samples_per_s": theirs,
            "basis": basis, "factor": factor, "efficiency": factor / world,
            "same_batch_per_gpu": same_batch,
            # train.validate refused every other difference before the job ran.
            "differs": alike.describe(alike.differences(base, job, ["device"]))}


def _rates(job: dict, base: dict) -> tuple[float, float, str]:
    """(the job's samples/s, the baseline's, which rates): the sustained ones where both
    runs have one, else both runs' profiled steps (a run too short to settle)."""
    mine, theirs = ((run.get("sustained") or {}).get("samples_per_s") for run in (job, base))
    if mine and theirs:
        return mine, theirs, "sustained"
    return samples_per_s(job), samples_per_s(base), "profiled steps"


def combine(main: dict, per_rank: list[dict], world: int, backend: str) -> dict:
    """Rank 0's summary with the job's section: every rank's phases, step and
    communication, samples a second."""
    record = dict(main)
    record["distributed"] = {
        "world": world, "backend": backend,
        "global_batch": main["config"]["batch_size"] * world,
        "ranks": per_rank,
    }
    record["distributed"]["samples_per_s"] = samples_per_s(record)
    return record


def format_ranks(record: dict) -> str:
    """The per-rank lines printed under rank 0's table."""
    job = record["distributed"]
    # No rate here: the sustained line above is the job's; a second one from the profiled
    # steps' mean read as a contradiction (394 against 384 samples/s).
    lines = [f"{job['world']} ranks ({job['backend']}), global batch {job['global_batch']}; "
             "each rank's profiled steps:",
             "| rank | step CPU ms | step GPU ms | comm GPU ms | overlapped | exposed | "
             "collectives |", "|---|---|---|---|---|---|---|"]
    for r, rank in enumerate(job["ranks"]):
        comm = rank["communication"]
        if not comm["gpu"]:  # gloo between CPU processes: no GPU kernels to time
            lines.append(f"| {r} | {rank['step']['cpu_ms']:.2f} | - | - | - | - | - |")
            continue
        lines.append(f"| {r} | {rank['step']['cpu_ms']:.2f} | {rank['step']['gpu_ms']:.2f} | "
                     f"{comm['comm_ms']:.2f} | {comm['overlapped_ms']:.2f} | "
                     f"{comm['exposed_ms']:.2f} | {comm['collectives']:.0f} |")
    if "scaling" in job:
        s = job["scaling"]
        lines.append(f"scaling against {s['baseline']}: {s['factor']:.2f}x "
                     f"({s['efficiency'] * 100:.0f} % of {job['world']}x), by the "
                     f"{s.get('basis', 'profiled steps')} rates")
        if s.get("differs"):
            lines.append(f"warning: the baseline ran elsewhere ({s['differs']}): this "
                         "scaling mixes devices")
    return "\n".join(lines)
