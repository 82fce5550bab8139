"""Writing a command's output so that an error never leaves a file that looks finished,
and taking an output folder for one command at a time.

    write_whole(path, text)        the whole text or no file (a full disk leaves none)
    claim(folder, kind, owner)     folder is this command's until it ends
    release_claims()               command() calls it when the command ends, however
"""

import contextlib
import os
from pathlib import Path

from core.errors import UserError

_claims: list[Path] = []


@contextlib.contextmanager
def whole(path: Path):
    """Yields a hidden partial path beside `path`; renamed to `path` when the block ends,
    removed if it raises (ENOSPC, say): a reader sees the whole file or none."""
    partial = path.with_name(f".{path.name}.partial")
    try:
        yield partial
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise


def write_whole(path: Path, text: str) -> None:
    with whole(path) as partial:
        partial.write_text(text)


def claim(folder: Path, kind: str, owner: str) -> None:
    """Take `folder` for this command alone: a file made with O_EXCL, so of two commands
    started together on one folder one gets it and the other stops here with one line,
    before it measures anything. Released when the command ends (release_claims)."""
    path = folder / f".{kind}-claimed"
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        holder = path.read_text().strip() if path.exists() else "?"
        raise UserError(f"{folder} is being written by another {owner} ({holder}): choose "
                        f"a new --out") from None
    except OSError as exc:
        raise UserError(f"cannot write in {folder}: {exc.strerror}") from None
    with os.fdopen(fd, "w") as f:
        f.write(f"pid {os.getpid()}\n")
    _claims.append(path)


def release_claims() -> None:
    while _claims:
        _claims.pop().unlink(missing_ok=True)
