"""A small /dev/shm (Docker's 64 MB): the loaders say before the run what their workers
need of it and what it offers, in one line and exit 2; with no workers nothing is shared;
nothing is left in /dev/shm (data/shared_memory.py)."""

import shutil
import subprocess
import sys

import pytest

from core.errors import UserError
from data import shared_memory
from tests.helpers import REPO

RUN = [sys.executable, "train.py", "--preset", "cpu", "--loss", "packed"]


def test_what_does_not_fit_is_one_line(monkeypatch):
    monkeypatch.setattr(shared_memory, "free_bytes", lambda: (60 * 10**6, 64 * 10**6))
    shared_memory.check(50 * 10**6, "a loader")
    with pytest.raises(UserError, match="a loader needs 2.28 GB of shared memory and "
                       "/dev/shm has 60 MB free \\(of 64 MB\\): give the container more "
                       "\\(docker run --shm-size=3g\\), or use a smaller --batch-size"):
        shared_memory.check(2_283_929_600, "a loader")
    monkeypatch.setattr(shared_memory, "free_bytes", lambda: None)  # no /dev/shm: unchecked
    shared_memory.check(10**12, "a loader")


def _in_a_small_shm(size: str, args: list[str], tmp_path):
    """train.py in a private mount namespace whose /dev/shm is a tmpfs of `size`; then
    what /dev/shm holds. Skipped where namespaces or mounts are refused."""
    if not shutil.which("unshare"):
        pytest.skip("no unshare here")
    probe = subprocess.run(["unshare", "-m", "mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs",
                            "/dev/shm"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs in a mount namespace here: {probe.stderr.strip()}")
    script = (f"mount -t tmpfs -o size={size} tmpfs /dev/shm && "
              f"{' '.join(RUN + args)} --out-dir {tmp_path / 'runs'}; code=$?; "
              "echo SHM:$(ls -A /dev/shm); exit $code")
    done = subprocess.run(["unshare", "-m", "sh", "-c", script], cwd=REPO, text=True,
                          capture_output=True, timeout=300)
    held = done.stdout.rsplit("SHM:", 1)[1].split()
    return done, held


@pytest.mark.parametrize("loader", ("torch", "ring"))
def test_a_64_mb_shm_is_refused_before_the_run(tmp_path, loader):
    done, held = _in_a_small_shm("64m", ["--batch-size", "256", "--image-size", "256",
                                         "--num-workers", "2", "--loader", loader], tmp_path)
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 2 and len(errors) == 1, done.stderr[-2000:]
    assert "of shared memory and /dev/shm has" in errors[0] and "--shm-size" in errors[0]
    assert "Traceback" not in done.stderr
    assert held == []  # no torch_<pid>_* file left behind
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_no_workers_need_no_shared_memory(tmp_path):
    done, held = _in_a_small_shm("1m", ["--batch-size", "8", "--image-size", "32",
                                        "--hidden", "32", "--num-workers", "0"], tmp_path)
    assert done.returncode == 0, done.stderr[-2000:]
    assert held == []
