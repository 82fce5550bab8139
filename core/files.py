"""Writing a command's output so that an error never leaves a file that looks finished,
and taking an output folder for one command at a time.

    write_whole(path, text)        the whole text or no file (a full disk leaves none)
    read_json_object(path, what)   a JSON object, or one line naming the file and why not
    claim(folder, kind, owner)     folder is this command's until it ends
    release_claims()               command() calls it when the command ends, however
"""

import contextlib
import json
import os
import sys
from pathlib import Path

from core.errors import UserError

_claims: list[Path] = []
_made_here: list[Path] = []  # folders this command made (made_here)


@contextlib.contextmanager
def whole(path: Path):
    """Yields a hidden partial path beside `path`; renamed to `path` when the block ends,
    removed if it raises (ENOSPC, say): a reader sees the whole file or none."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        yield partial
        os.replace(partial, path)
    except OSError as exc:
        partial.unlink(missing_ok=True)
        if exc.filename is None:  # a write (not an open) refused: ENOSPC names no file
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def write_whole(path: Path, text: str) -> None:
    with whole(path) as partial:
        partial.write_text(text)


def read_json_object(path: Path, what: str) -> dict:
    """The JSON object in path (`what` says whose: "--runs", say); a UserError of one line
    naming the file where it cannot be read, is not text, not JSON (empty or truncated)
    or not an object. compare --runs met such files with 21-33 lines of traceback."""
    try:
        data = json.loads(Path(path).read_bytes().decode())
    except OSError as exc:
        raise UserError(f"{what}: cannot read {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise UserError(f"{what}: {path} is not text") from None
    except ValueError as exc:
        why = "it is empty" if not exc.doc.strip() else f"{exc.msg} at line {exc.lineno}"
        raise UserError(f"{what}: {path} is not JSON ({why}: truncated?)") from None
    if not isinstance(data, dict):
        raise UserError(f"{what}: {path} holds a JSON {type(data).__name__}, not an object")
    return data


def claim(folder: Path, kind: str, owner: str) -> None:
    """Take `folder` for this command alone: a file made with O_EXCL, so of two commands
    started together on one folder one gets it and the other stops here with one line,
    before it measures anything. Released when the command ends (release_claims). A claim
    whose process has ended (kill -9 leaves it) is taken over, with a line saying so."""
    path = folder / f".{kind}-claimed"
    for attempt in range(2):
        try:
            fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            break
        except FileExistsError:
            holder = _read(path)
            if attempt == 0 and _stale(holder) and _set_aside(path, holder):
                print(f"note: taking over {folder}: the {owner} that claimed it ({holder}) "
                      "has ended without releasing it", file=sys.stderr)
                continue
            raise UserError(f"{folder} is being written by another {owner} ({holder or '?'}):"
                            f" choose a new --out") from None
        except OSError as exc:
            raise UserError(f"cannot write in {folder}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(f"pid {os.getpid()} started {_start_time(os.getpid())}\n")
    _claims.append(path)


def _read(path: Path) -> str:
    try:
        return path.read_text().strip()
    except OSError:
        return ""


def _start_time(pid: int) -> str:
    """The process's start time in clock ticks since boot (Linux /proc), which tells a
    reused pid from the claimer; "" where /proc does not say."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


def _stale(holder: str) -> bool:
    """Whether the claim's process has ended: no such pid, or a pid now another process's
    (its start time differs). A claim that names no pid is never taken as stale."""
    words = holder.split()
    if len(words) < 2 or words[0] != "pid" or not words[1].isdigit():
        return False
    pid = int(words[1])
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except PermissionError:
        return False  # alive, someone else's
    started = words[3] if len(words) >= 4 and words[2] == "started" else ""
    return bool(started) and started != _start_time(pid)


def _set_aside(path: Path, stale: str) -> bool:
    """Moves the stale claim out of the way (a rename: atomic). Of two commands taking it
    over, one moves it and makes its own; the other finds the claim gone or new: it puts
    back what it moved if that was not the stale claim, and stops as usual."""
    aside = path.with_name(f"{path.name}.stale-{os.getpid()}")
    try:
        os.rename(path, aside)
    except OSError:
        return False
    if _read(aside) != stale:  # another command's fresh claim: back where it was
        os.replace(aside, path)
        return False
    aside.unlink(missing_ok=True)
    return True


def made_here(folder: Path) -> None:
    """`folder` was made by this command: release_claims removes it if it ends empty (a
    Ctrl-C or SIGTERM between its making and the study's own early end left it behind)."""
    _made_here.append(folder)


def is_made_here(folder: Path) -> bool:
    """Whether this command made `folder` (made_here) and has not yet released it."""
    return folder in _made_here


def release_claims(folders: bool = True) -> None:
    """The command's claims given back, and (folders) the folders it made that hold
    nothing removed."""
    while _claims:
        _claims.pop().unlink(missing_ok=True)
    while folders and _made_here:
        try:
            _made_here.pop().rmdir()
        except OSError:  # it holds the study's work, or it was renamed or removed
            pass
