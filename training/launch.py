"""Starts a script on N ranks with torchrun (one host, or several meeting at --rdzv), and
turns a failed job into the line of the rank that failed first, with its exit code.

    python3 -m training.launch --nproc 2 train.py --loss padded     # make profile GPUS=2

Its design in full: docs/design.md."""

import gc
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from core.commands import run_command
from core.errors import ERRORS_ENV, UserError, left_line, one_line, report_errors
from core.signals import joined_itself
from training import job_notes, rendezvous
from training.ranks import caused_by_another

EVERY = "; every rank was stopped"
USAGE = ("usage: python3 -m training.launch --nproc N [--nnodes H --rdzv HOST:PORT "
         "[--wait SECONDS]] SCRIPT [ARGS...]")


def _whole(value: str, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise UserError(f"{what} must be a whole number, not {value!r}") from None
    if number < 1:
        raise UserError(f"{what} must be at least 1, not {number}")
    return number


@dataclass(frozen=True)
class Meeting:
    """Several hosts meeting at `endpoint` (make profile NODES=H RDZV=HOST:PORT), each
    waiting at most wait_s for the others (RDZV_WAIT)."""
    nodes: int
    endpoint: str
    wait_s: int = rendezvous.WAIT_S

    def torchrun_args(self) -> list[str]:
        port = self.endpoint.rpartition(":")[2]
        # The job's id: every host of one job gives the same, from the endpoint.
        return [f"--nnodes={self.nodes}", "--rdzv-backend=c10d",
                f"--rdzv-endpoint={self.endpoint}", f"--rdzv-id=ragged-{port}",
                f"--rdzv-conf={rendezvous.conf(self.wait_s)}"]


def parse(argv: list[str]) -> tuple[int, Meeting | None, list[str]]:
    """(ranks on this host, the hosts' meeting or None for this host alone, the script
    and its args)."""
    if len(argv) < 3 or argv[0] != "--nproc":
        raise UserError(USAGE)
    nproc, rest = _whole(argv[1], "GPUS"), argv[2:]
    nodes, endpoint, wait_s = 1, "", rendezvous.WAIT_S
    while rest and rest[0] in ("--nnodes", "--rdzv", "--wait"):
        if len(rest) < 3:
            raise UserError(USAGE)
        if rest[0] == "--nnodes":
            nodes = _whole(rest[1], "NODES")
        elif rest[0] == "--wait":
            wait_s = _whole(rest[1], "RDZV_WAIT")
        else:
            endpoint = rest[1]
        rest = rest[2:]
    if nodes == 1:
        if endpoint:
            raise UserError(f"--rdzv {endpoint} meets several hosts: give --nnodes too "
                            "(NODES=H), or leave it out to run on this host alone")
        return nproc, None, rest
    host, _, port = endpoint.rpartition(":")
    if not (host and port.isdigit()):
        raise UserError(f"NODES={nodes} needs RDZV=HOST:PORT, an address every host reaches "
                        f"(the first host's, say), not {endpoint!r}")
    return nproc, Meeting(nodes, endpoint, wait_s), rest


def check_devices(nproc: int) -> None:
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() < nproc:
        raise UserError(f"GPUS={nproc} but this machine has {torch.cuda.device_count()} "
                        "GPU(s): ask for at most that many")


def first_failure(failures: dict, folder: Path | None = None) -> int:
    """The rank whose end ended the job. torchrun's choice (the earliest timestamp in
    whole seconds, rank 0 winning a tie) blamed the wrong rank when a peer failed in the
    same second. So: a rank killed by a signal other than torchrun's SIGTERM, then one
    that ended on its own (a user error first), and last those torchrun stopped; within
    each, one whose line (in `folder`) is its own cause before one that names another
    rank's end, and one that relays another's line last; then the earliest, lowest."""
    def order(rank):
        failure = failures[rank]
        killed = failure.exitcode < 0 and failure.exitcode != -signal.SIGTERM
        stopped = failure.exitcode in (-signal.SIGTERM, 130)
        line = left_line(folder, rank)
        return (not killed, stopped, failure.exitcode != 2,
                line is not None and caused_by_another(line),
                line is not None and relays_another(line), failure.timestamp, rank)
    return min(failures, key=order)


def relays_another(line: str) -> bool:
    """Whether a rank's line passes on another rank's ('rank 1 failed: ...'): the one
    whose line it passes on is blamed first."""
    return re.search(r"\brank \d+ failed: ", line) is not None


def explain(rank: int, failure, folder: Path) -> tuple[str, int]:
    """The line and exit code for the rank torchrun saw fail first."""
    line = left_line(folder, rank)  # the rank's own line, as train.py would have printed it
    if line is None:
        line = (f"killed by {failure.signal_name()}" if failure.exitcode < 0 else
                f"exited with code {failure.exitcode} (see its output above)")
    code = failure.exitcode if failure.exitcode in (1, 2, 130) else 1
    return f"rank {rank} failed: {line}{EVERY}", code


def note_why_ranks_stop() -> None:
    """Has torchrun leave training/job_notes.py's notes before it stops the ranks with
    SIGTERM: its handler of Ctrl-C and SIGTERM leaves interrupted.txt, its PContext.close
    (called at once on a failure) stopping.txt. PContext.start installs the handler by
    its module name (torch 2.11 and 2.13 alike); where a torch has neither, a SIGTERM
    without a note reads, after job_notes.NOTE_WAIT_S, as a failure's."""
    from torch.distributed.elastic.multiprocessing import api
    _note_first(api, "_terminate_process_handler", job_notes.note_the_users_signal)
    _note_first(api.PContext, "close", job_notes.note_a_failures_stop)


def _note_first(owner, name: str, note) -> None:
    """owner.name, where it exists, made to leave note(the job's notes folder) before it
    runs, where the launcher set that folder; once, however often called."""
    original = getattr(owner, name, None)
    if original is None or getattr(original, "notes", False):
        return

    def noting(*args, **kwargs):
        if folder := os.environ.get(ERRORS_ENV):
            note(Path(folder))
        return original(*args, **kwargs)
    noting.notes = True
    setattr(owner, name, noting)


def quiet_torchrun() -> None:
    """The one line replaces what torchrun's agent logs (each rank it stops, the signal,
    a report): its modules read LOGLEVEL when imported, so this runs first. torch's C++
    side (the store's failed reads, NCCL's watchdog) says only what is fatal, here and in
    the ranks (TORCH_CPP_LOG_LEVEL=INFO shows it all again): each rank names its own
    cause. And NCCL's watchdog only aborts the communicator on an error (TORCH_NCCL_
    ASYNC_ERROR_HANDLING=2), rather than take the process down before its early end has
    marked its folder."""
    os.environ["LOGLEVEL"] = "CRITICAL"
    os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "FATAL")
    os.environ.setdefault("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2")
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def launch(nproc: int, meeting: Meeting | None, script: list[str]) -> int:
    if "-h" in script or "--help" in script:  # once, not once a rank
        return subprocess.call([sys.executable, *script])
    quiet_torchrun()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.elastic.rendezvous.api import RendezvousError
    from torch.distributed.run import get_args_parser, run
    quiet_torchrun()  # and the loggers those imports made
    check_devices(nproc)
    if meeting is not None and (unresolved := rendezvous.check_host(meeting.endpoint)):
        raise UserError(unresolved)
    folder = Path(tempfile.mkdtemp(prefix="ragged-ranks-"))
    os.environ[ERRORS_ENV] = str(folder)
    # torchrun would set 1 thread per rank and print a banner saying so.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # --log-dir: torchrun's per-rank error files go under the folder removed below, not
    # into a /tmp/torchelastic_* folder of their own that no one removes.
    args = get_args_parser().parse_args([
        *(meeting.torchrun_args() if meeting else ["--standalone"]),
        f"--nproc-per-node={nproc}", "--max-restarts=0", f"--log-dir={folder / 'torchrun'}",
        *script])
    note_why_ranks_stop()
    if meeting is not None:
        rendezvous.watch(meeting.endpoint, meeting.nodes, meeting.wait_s,
                         lambda: shutil.rmtree(folder, ignore_errors=True))
    try:
        run(args)
        return 0
    except ChildFailedError as exc:
        rank = first_failure(exc.failures, folder)
        line, code = explain(rank, exc.failures[rank], folder)
        settled = job_notes.settle(folder, line.removesuffix(EVERY))
        return say(f"{line}; {settled}" if settled else line, code)
    except RendezvousError as exc:
        said = str(exc).strip() and f": {one_line(exc)}"  # the timeout's message is empty
        return say(f"the rendezvous at {meeting.endpoint} did not complete in "
                   f"{meeting.wait_s} s{said} (the other hosts did not all join; "
                   "RDZV_WAIT=seconds to wait longer)", 1)
    except (KeyboardInterrupt, SignalException):
        no_collections_after_a_stop()
        if meeting is not None and not rendezvous.STARTED.is_set():
            return say(f"stopped while waiting for the rendezvous at {meeting.endpoint}; "
                       "no rank had started", 130)
        where = left_line(folder, 0) or "interrupted"
        settled = job_notes.settle(folder, f"{where}; rank 0 did not mark its run folder")
        return say(f"{where}{EVERY}" + (f"; {settled}" if settled else ""), 130)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def no_collections_after_a_stop() -> None:
    """No automatic garbage collection from here to the launcher's exit. An agent that a
    signal ended leaves torchrun's rendezvous handler running (torch.distributed.launcher
    does not shut it down then), and the handler's keep-alive thread is stopped only by its
    finalizer, which joins that thread. Freed by a collection that the keep-alive thread
    itself set off, the join raised "cannot join current thread": an "Exception ignored"
    traceback under the launcher's line (one CI at 4dda26e). The launcher is leaving: its
    garbage can wait, and its exit (os._exit) runs no such finalizer. A collection is not
    the only way there: a keep-alive in flight holds the handler, and when it returns
    that thread drops the last reference (a CI at 92f2ab6). So that error is dropped too;
    every other unraisable one still reaches the hook."""
    gc.disable()
    hook = sys.unraisablehook

    def quiet(unraisable):
        if not joined_itself(unraisable):
            hook(unraisable)
    sys.unraisablehook = quiet


def say(line: str, code: int) -> int:
    """The launcher's one line; if the rendezvous watch spoke first, it is ending the
    process with its own code: wait for that."""
    if not rendezvous.speak_once(line):
        time.sleep(rendezvous.GRACE_S * 5)
    return code


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return report_errors(lambda: launch(*parse(argv)))


if __name__ == "__main__":
    # SIGTERM stops the job as Ctrl-C does (torchrun passes it to every rank). Ctrl-C's
    # handler is set too, not inherited: a launcher started from a shell's background job
    # inherits SIGINT ignored, and Python then leaves it so; a SIGINT sent to it while it
    # waited at a rendezvous did nothing.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    run_command(main, "every rank was stopped", stop_signals=False)  # its own handling
