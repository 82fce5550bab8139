"""Every exception of the project's own, and how a command line turns one into its line.

    ProjectError            a message that is the one line to print; no traceback
      UserError             a mistake the user can fix (an option, the data): exit 2
        UsageError          a flag the command-line parser refused
        InputError          tensors a loss or kernel cannot take (also a ValueError)
      BackendUnavailable    a kernel backend this machine cannot run (also a RuntimeError)
      RunFailed             a run ended on an error; its folder is marked (exit 2 when the
                            error was the user's, 1 otherwise)
    RunInterrupted          Ctrl-C or SIGTERM ended a run (a KeyboardInterrupt): exit 130
    NonFiniteLoss           the loss became NaN or inf (a RuntimeError; the run fails on it)

Anything else is a bug and keeps its traceback. Nothing here imports torch, nor anything of
the project's own but core/signals.py (core/commands.py turns a command's errors into its
exit).
"""

import errno
import os
import sys
from pathlib import Path

from core.signals import wrapped_interrupt

# The launcher's folder where each rank of a job leaves its one line (training/launch.py).
ERRORS_ENV = "RAGGED_RANK_ERRORS"


class ProjectError(Exception):
    """An error whose message is the line to print."""

    exit_code = 1


class UserError(ProjectError):
    """A mistake the user can fix; the message says how."""

    exit_code = 2


class UsageError(UserError):
    """A flag the parser refused."""


class InputError(UserError, ValueError):
    """Tensors a loss or kernel cannot take; the message says what it needs. A library
    caller can catch it as the ValueError it also is."""


class BackendUnavailable(ProjectError, RuntimeError):
    """A kernel backend cannot run on this machine; the message says what it needs."""


class RunFailed(ProjectError):
    """A run ended on an error; str() is the line to print, __cause__ the error."""

    @property
    def exit_code(self) -> int:
        return 2 if isinstance(self.__cause__, UserError) else 1


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C or SIGTERM ended the run; str() is the line to print."""


class StudyInterrupted(RunInterrupted):
    """Ctrl-C or SIGTERM ended a command that makes many measurements; str() is the whole
    line, saying what was kept."""


class NonFiniteLoss(RuntimeError):
    """The loss became NaN or inf: the steps after it would measure nothing useful."""


def one_line(exc: BaseException) -> str:
    """The message of an error, also when a DataLoader worker re-raised it.

    A worker's exception comes back with its traceback folded into the message; the user
    needs only its last line, without the 'core.errors.UserError: ' prefix. A write the
    file system refused (WRITE_ERRNOS) says so (write_failure).
    """
    if is_write_failure(exc):
        return write_failure(exc)
    text = str(exc).strip()
    last = text.splitlines()[-1] if text else type(exc).__name__
    prefix = "UserError: "
    return last.split(prefix, 1)[1] if prefix in last else last


def interruption(exc: KeyboardInterrupt) -> str:
    """The line of a Ctrl-C or SIGTERM: a run's own (RunInterrupted: the signal, the step
    it was at, what it kept), or the signal alone ('SIGTERM' is stop_once's message)."""
    return str(exc) if isinstance(exc, RunInterrupted) else \
        f"interrupted ({str(exc) or 'Ctrl-C'})"


def exit_code(exc: BaseException) -> int | None:
    """The exit code of an error a command prints as one line; None for a bug."""
    if isinstance(exc, KeyboardInterrupt):
        return 130
    if isinstance(exc, ProjectError):
        return exc.exit_code
    return None


def report_errors(run, *args, report=None) -> int:
    """run(*args)'s exit code; where it raises a ProjectError, that error's code, its
    line printed on stderr (or given to `report`: a rank of a job leaves it for its
    launcher). A command's main() is this around its body; anything else is a bug and
    keeps its traceback."""
    try:
        return run(*args)
    except ProjectError as exc:
        (report or print_error)(one_line(exc))
        return exc.exit_code
    except OSError as exc:
        if not is_write_failure(exc):
            raise
        (report or print_error)(one_line(exc))
        return 1
    except Exception as exc:
        interrupt = wrapped_interrupt(exc)
        if interrupt is None:
            raise
        raise interrupt from None  # a Ctrl-C or SIGTERM, however Python wrapped it


# What the file system, not the code, refused: a full disk or quota, a read-only one, a
# name too long. One line naming the cause, not a traceback.
WRITE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.ENAMETOOLONG)


def is_write_failure(exc: BaseException) -> bool:
    return isinstance(exc, OSError) and exc.errno in WRITE_ERRNOS


def write_failure(exc: OSError) -> str:
    full = " (the disk is full)" if exc.errno in (errno.ENOSPC, errno.EDQUOT) else ""
    where = f" {os.fsdecode(exc.filename)}" if exc.filename else ""  # TensorBoard's: bytes
    return f"could not write{where}: {exc.strerror}{full}"


def print_error(line: str) -> None:
    """A command's one line on stderr; on a rank of training/launch.py's job, left for the
    launcher instead, which prints the line of the rank that failed first: one speaker,
    once, where every rank of a study printed its own and two could interleave."""
    if not leave_for_launcher(line):
        print(f"error: {line}", file=sys.stderr)


def launcher_folder() -> Path | None:
    """The launcher's folder, on a rank of training/launch.py's job; None otherwise."""
    folder = os.environ.get(ERRORS_ENV)
    return Path(folder) if folder and int(os.environ.get("WORLD_SIZE", "1")) > 1 else None


def leave_for_launcher(line: str) -> bool:
    """Leaves this rank's line in the launcher's folder; False where no launcher asked
    for it (one process, or a launcher gone and its folder removed)."""
    folder = launcher_folder()
    if folder is None:
        return False
    try:
        _line_file(folder, int(os.environ.get("RANK", "0"))).write_text(line + "\n")
    except OSError:
        return False
    return True


def left_line(folder: Path | None, rank: int) -> str | None:
    """The line rank `rank` left in the launcher's folder (leave_for_launcher), or None."""
    try:
        return _line_file(folder, rank).read_text().strip() if folder is not None else None
    except OSError:  # none left (or the folder removed)
        return None


def _line_file(folder: Path, rank: int) -> Path:
    return folder / f"rank{rank}.txt"
