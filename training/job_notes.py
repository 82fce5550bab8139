"""What the ranks of a job and their launcher (training/launch.py) tell each other through
the launcher's folder ($RAGGED_RANK_ERRORS), beside each rank's one line (core/errors.py):

    run.json      rank 0's run in progress: its folder, config and planned steps, written
                  when the folder is made, removed once the folder is settled (complete,
                  or marked by rank 0's early end)
    stopping.txt  the launcher is stopping the ranks because one failed (not Ctrl-C)

Why: a rank 0 killed by SIGKILL cannot mark its own folder, which was left with no suffix
and no summary; the launcher, which outlives it, marks it -failed with its own line. And
the ranks torchrun stops after another failed get the same SIGTERM as after a Ctrl-C; a
rank 0 that met the SIGTERM before its peer's closed socket labelled the run
-interrupted, one that met the socket first -failed (a race). The launcher writes
stopping.txt before torchrun sends any SIGTERM, so a stopped rank reads why.

Files, not collectives: the writer may be dead, and the readers are other processes.
"""

import json
import os
from pathlib import Path

from core.errors import ERRORS_ENV

RUN, STOPPING = "run.json", "stopping.txt"


def _folder() -> Path | None:
    """The launcher's folder, on a rank of a job; None otherwise."""
    folder = os.environ.get(ERRORS_ENV)
    return Path(folder) if folder and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None


# -- rank 0's side --------------------------------------------------------------------


def running(run_dir: Path, config: dict, planned_steps: int) -> None:
    """Rank 0 has made its run folder: what the launcher needs to mark it if rank 0 dies."""
    folder = _folder()
    if folder is None:
        return
    note = {"run_dir": str(run_dir.absolute()), "config": config,
            "planned_steps": planned_steps}
    try:
        (folder / RUN).write_text(json.dumps(note))
    except OSError:  # the launcher is gone and its folder with it
        pass


def settled() -> None:
    """Rank 0's folder is final (complete, marked or removed): the launcher leaves it."""
    folder = _folder()
    if folder is not None:
        (folder / RUN).unlink(missing_ok=True)


# -- every rank's side ----------------------------------------------------------------


def stopped_after_a_failure() -> bool:
    """Whether the SIGTERM this rank got is the launcher stopping the job because
    another rank failed (not the user's Ctrl-C or SIGTERM)."""
    folder = _folder()
    return folder is not None and (folder / STOPPING).exists()


# -- the launcher's side --------------------------------------------------------------


def stop_after_a_failure(folder: Path) -> None:
    """Said before the ranks are stopped because one failed."""
    (folder / STOPPING).write_text("a rank failed\n")


def settle(folder: Path, line: str) -> str:
    """Marks rank 0's unsettled run folder -failed with `line` as its reason (a summary
    of what is known: no step was summarised); '' if there is none, else what was done."""
    from profiling.run_folder import display, mark
    note_file = folder / RUN
    try:
        note = json.loads(note_file.read_text())
        run_dir = Path(note["run_dir"])
        if not run_dir.is_dir():
            return ""
        summary = {"status": "failed", "reason": line, "planned_steps": note["planned_steps"],
                   "config": note["config"]}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        return f"its run folder is {display(mark(run_dir, 'failed'))}"
    except (OSError, ValueError, KeyError):  # none, or rank 0 settled it meanwhile
        return ""
