"""Run folders: where a run's files go, checked before anything is written, never
overwritten, and on an early end marked for what they hold or removed.

A folder whose name has no suffix holds a complete run. One that ended early either holds
something worth keeping and is renamed <name>-interrupted or <name>-failed (its
summary.json says so, and why), or holds nothing useful and is removed.
"""

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path

from core.errors import UserError

EARLY_END_STATUSES = ("interrupted", "failed")
NAME_BYTES = 255  # a folder name's limit on Linux's file systems


def utc_stamp() -> str:
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def check_run_name(name: str) -> None:
    """A run name is one folder name: it cannot climb out of the output folder."""
    if name in (".", "..") or "/" in name or os.sep in name or "\0" in name:
        raise UserError(f"--run-name {name!r} must be a plain folder name (no '/', not "
                        "'.' or '..')")
    # A folder name is at most 255 bytes, and an early end adds "-interrupted".
    longest = NAME_BYTES - max(len(s) + 1 for s in EARLY_END_STATUSES)
    if len(name.encode()) > longest:
        raise UserError(f"--run-name is {len(name.encode())} bytes long: a run folder's name "
                        f"may have at most {longest}")
    if name.endswith(tuple(f"-{s}" for s in EARLY_END_STATUSES)):
        raise UserError(f"--run-name {name!r} ends like a run that ended early; choose "
                        "another name")


def check_out_dir(out_dir: str, flag: str = "--out-dir") -> Path:
    """The output folder as the user meant it (relative to the current folder), if it is
    or can become a writable folder; nothing is created here. flag: the option that
    named it (the studies' --out)."""
    path = Path(out_dir).expanduser().absolute()
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise UserError(f"{flag} {out_dir}: {existing} is a file, not a folder")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise UserError(f"{flag} {out_dir}: {existing} is not writable")
    return path


def new_run_dir(base: Path, name: str) -> Path:
    """A fresh folder base/name (or base/name-2, -3...): a run never overwrites another."""
    for suffix in [""] + [f"-{i}" for i in range(2, 1000)]:
        path = base / (name + suffix)
        if any(path.with_name(path.name + f"-{s}").exists() for s in EARLY_END_STATUSES):
            continue  # keeps the marked name of an earlier early end free of clashes
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            continue
        except OSError as exc:
            raise UserError(f"cannot make the run folder {path}: {exc.strerror}") from None
    raise UserError(f"could not find a free run folder name under {base}")


def mark(run_dir: Path, status: str) -> Path:
    """Renames a run that ended early to <name>-<status>; returns the new path."""
    assert status in EARLY_END_STATUSES, status
    marked = run_dir.with_name(f"{run_dir.name}-{status}")
    run_dir.rename(marked)
    return marked


def remove(run_dir: Path) -> OSError | None:
    """Removes the folder; the error that left it or part of it (a read-only file
    system), else None: a run that says "nothing kept" must have kept nothing."""
    try:
        shutil.rmtree(run_dir)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    return None


def display(path: Path) -> str:
    """A path as the user would type it: relative to the current folder where it is below."""
    try:
        return str(path.relative_to(Path.cwd()))
    except ValueError:
        return str(path)
