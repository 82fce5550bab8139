"""What several test files share: the repository's path, the tiny and small run sizes,
and how a command's output is read."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
# A train.py run that takes seconds on 2 CPU cores.
TINY = ["--preset", "cpu", "--batch-size", "4", "--image-size", "32", "--hidden", "32",
        "--num-workers", "0", "--wait", "0", "--warmup", "1", "--active", "2"]
# A short GPU run (make test-gpu).
SMALL = ["--preset", "gpu", "--batch-size", "64", "--image-size", "64", "--hidden", "256",
         "--num-workers", "2", "--wait", "1", "--warmup", "1", "--active", "2",
         "--no-compile"]


def our_lines(stderr: str) -> list[str]:
    """stderr without libkineto's 'USDT:' markers (torch 2.13's CPU build prints them on
    every profiled run; no setting turns them off)."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("USDT:")]


def cli(*args, cwd=REPO, timeout=300):
    """train.py at the TINY size in a process of its own."""
    return subprocess.run([sys.executable, str(REPO / "train.py"), *TINY, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def one_line_and_nothing_written(result, out: Path, message: str, code: int = 2):
    lines = our_lines(result.stderr)
    assert result.returncode == code, result.stderr[-2000:]
    assert len(lines) == 1 and message in lines[0], result.stderr[-2000:]
    assert not out.exists() or not list(out.iterdir()), sorted(out.rglob("*"))


def make_every_loss_nan(monkeypatch) -> None:
    """Every strategy that losses.get gives from now on returns a NaN loss."""
    import dataclasses

    import losses
    real_get = losses.get

    def get(*args, **kwargs):
        strategy = real_get(*args, **kwargs)
        return dataclasses.replace(strategy, loss=lambda p, t: strategy.loss(p, t) * float("nan"))
    monkeypatch.setattr(losses, "get", get)
