"""What a run records about where it ran: device, versions, commit."""

import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parent.parent


def _git(*args) -> str | None:
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                              timeout=10)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def environment() -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = torch.cuda.is_available()
    # GIT_COMMIT, where set, names the commit of a copied tree: the device machine's copy
    # carries a stale .git, whose HEAD and status say nothing about the tree.
    copied = os.environ.get("GIT_COMMIT")
    status = None if copied else _git("status", "--porcelain", "--untracked-files=no")
    return {
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "commit": copied or _git("rev-parse", "HEAD"),
        "dirty": None if status is None else bool(status),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        # NCCL's settings change what a several-GPU run measures (its protocol, NVLS).
        "nccl_env": {k: v for k, v in sorted(os.environ.items()) if k.startswith("NCCL_")},
    }
