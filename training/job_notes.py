"""What the ranks of a job and their launcher tell each other through the launcher's
folder: rank 0's run in progress, the user's interruption against a failure's stop, each
rank's pid. Files, not collectives: the writer may be dead. Its design in full: docs/design.md."""

import json
import os
import signal
import time
from pathlib import Path

from core.errors import launcher_folder
from core.run_folder import display, mark

RUN, INTERRUPTED, STOPPING = "run.json", "interrupted.txt", "stopping.txt"
PID = "pid"  # pid<rank>: a rank's process id
CONTINUED = "continued"  # continued<rank>: the launcher found that rank stopped and woke it
# How long a rank stopped by SIGTERM looks for the launcher's note: a SIGTERM sent to
# the whole process group reaches the ranks as the launcher's handler writes it.
NOTE_WAIT_S = 0.5


# -- rank 0's side --------------------------------------------------------------------


def running(run_dir: Path, config: dict, planned_steps: int) -> None:
    """Rank 0 has made its run folder: what the launcher needs to mark it if rank 0 dies."""
    folder = launcher_folder()
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
    folder = launcher_folder()
    if folder is not None:
        (folder / RUN).unlink(missing_ok=True)


# -- every rank's side ----------------------------------------------------------------


def stopped_for_a_failure(signal_name: str) -> bool:
    """Whether this rank's interrupt (`signal_name`: "SIGTERM", or "" for Ctrl-C) is
    torchrun stopping the job because another rank failed: a SIGTERM on a rank of the
    launcher's job, with no note that the launcher itself was signalled."""
    folder = launcher_folder()
    if folder is None or signal_name != "SIGTERM":
        return False
    deadline = time.monotonic() + NOTE_WAIT_S
    while not (folder / INTERRUPTED).exists():
        if (folder / STOPPING).exists() or time.monotonic() > deadline:
            return True
        time.sleep(0.05)
    return False


def users_signal_noted() -> bool:
    """Whether the launcher noted the user's Ctrl-C or SIGTERM (note_the_users_signal)."""
    folder = launcher_folder()
    return folder is not None and (folder / INTERRUPTED).exists()


# -- the launcher's side --------------------------------------------------------------


def note_the_users_signal(folder: Path) -> None:
    """Said by the launcher's signal handler, before torchrun stops the ranks."""
    _leave(folder / INTERRUPTED, "the launcher got Ctrl-C or SIGTERM\n")


def note_a_failures_stop(folder: Path) -> None:
    """Said by the launcher as torchrun begins to stop the ranks: for a failure, unless
    the user's signal was noted first. A stopped rank (SIGSTOP) is continued, so that
    torchrun's SIGTERM ends it now, not its SIGKILL 30 s later."""
    if not (folder / INTERRUPTED).exists():
        _leave(folder / STOPPING, "a rank failed; torchrun stops the others\n")
    for rank, pid in {**children_ranks(os.getpid()), **rank_pids(folder)}.items():
        if process_state(pid) in ("T", "t"):  # a rank that times out later still names it
            _leave(folder / f"{CONTINUED}{rank}", f"{pid}\n")
        try:
            os.kill(pid, signal.SIGCONT)
        except OSError:  # ended meanwhile
            pass


def was_stopped(rank: int) -> bool:
    """Whether the launcher found rank `rank` stopped (SIGSTOP) and continued it: a rank
    that times out after that finds it running, and must still name it."""
    folder = launcher_folder()
    return folder is not None and (folder / f"{CONTINUED}{rank}").exists()


def process_state(pid: int | None) -> str | None:
    """The state letter of a process (Linux /proc), None if it is gone or unknown."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rsplit(")", 1)[1].split()[0]  # after the command's name, which may hold ')'


def leave_pid(rank: int) -> None:
    """This rank's pid in the launcher's folder (the launcher continues a stopped rank;
    a rank that timed out looks for the peer that stopped answering)."""
    folder = launcher_folder()
    if folder is not None:
        _leave(folder / f"{PID}{rank}", str(os.getpid()))


def rank_pids(folder: Path) -> dict[int, int]:
    """rank -> pid of the ranks that left theirs in the launcher's folder."""
    pids = {}
    for path in folder.glob(f"{PID}*"):
        try:
            pids[int(path.name.removeprefix(PID))] = int(path.read_text())
        except (OSError, ValueError):  # being written, or removed
            continue
    return pids


def children_ranks(parent: int) -> dict[int, int]:
    """rank -> pid of the torchrun ranks that are parent's children (Linux /proc: each
    one's RANK), for a rank stopped before it left its pid (as the group starts)."""
    found = {}
    for name in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not name.isdigit() or parent_of(int(name)) != parent:
            continue
        try:
            environ = Path(f"/proc/{name}/environ").read_bytes().split(b"\0")
        except OSError:  # ended, or not ours to read
            continue
        for item in environ:
            if item.startswith(b"RANK="):
                found[int(item[5:])] = int(name)
    return found


def parent_of(pid: int) -> int | None:
    """The parent's pid of a process (Linux /proc), None if it is gone or unknown."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def _leave(note: Path, text: str) -> None:
    try:
        note.write_text(text)
    except OSError:  # the folder was removed (a rendezvous given up): no rank to tell
        pass


def settle(folder: Path, line: str) -> str:
    """Marks rank 0's unsettled run folder -failed with `line` as its reason; '' if there
    is none, else what was done."""
    note_file = folder / RUN
    try:
        note = json.loads(note_file.read_text())
        run_dir = Path(note["run_dir"])
        if not run_dir.is_dir():
            return ""
        summary = {"status": "failed", "reason": line, "planned_steps": note["planned_steps"],
                   "config": note["config"]}
        (run_dir / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
        # A plain trace that rank 0 died before packing is not kept half-done.
        for plain in run_dir.glob("*.pt.trace.json"):
            plain.unlink(missing_ok=True)
        return f"its run folder is {display(mark(run_dir, 'failed'))}"
    except (OSError, ValueError, KeyError):  # none, or rank 0 settled it meanwhile
        return ""
