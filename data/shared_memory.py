"""What a loader needs of /dev/shm, against what it offers, checked before the run starts:
a container's small default made the loaders fail with a traceback or hang, not with a
line the user could act on. The design in full: docs/design.md, this module's section."""

import glob
import os

from core.errors import UserError

SHM = "/dev/shm"


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 1e9 else f"{n / 1e6:.0f} MB"


def free_bytes() -> tuple[int, int] | None:
    """(free, size) of /dev/shm, or None where there is none (not Linux)."""
    try:
        st = os.statvfs(SHM)
    except OSError:
        return None
    return st.f_bavail * st.f_frsize, st.f_blocks * st.f_frsize


def check(need: int, what: str) -> None:
    """One line, and exit 2 through the UserError, where `need` bytes of shared memory will
    not fit in /dev/shm."""
    offered = free_bytes()
    if offered is None or need <= offered[0]:
        return
    free, size = offered
    raise UserError(f"{what} needs {_gb(need)} of shared memory and {SHM} has {_gb(free)} "
                    f"free (of {_gb(size)}): give the container more (docker run "
                    f"--shm-size={max(1, -(-need * 5 // 4 // 2**30))}g), or use a smaller "
                    "--batch-size, fewer --num-workers, or --num-workers 0 (no shared "
                    "memory at all)")


def remove_own_leftovers() -> None:
    """The empty files that a failed allocation of this process left in /dev/shm (PyTorch
    names them torch_<pid>_*)."""
    for path in glob.glob(os.path.join(SHM, f"torch_{os.getpid()}_*")):
        try:
            if os.path.getsize(path) == 0:
                os.unlink(path)
        except OSError:
            pass
