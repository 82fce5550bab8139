"""Runs far longer than their profiled window, as a user trains (the CPU preset at the
tiny size, a few hundred steps): every step is timed and counted in the sustained rate,
the data wait and the loader's own rate are reported; a worker's error or Ctrl-C deep
into such a run leaves no process, no shared-memory segment and a marked folder."""

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY, gone, our_lines, signal_after, start_long_run

STEPS = 300


def _leftovers() -> set[str]:
    """What a run's processes could leave on the machine: shared-memory segments (PyTorch
    names its own torch_*, multiprocessing its semaphores sem.*) and multiprocessing's
    temporary folders."""
    shm = Path("/dev/shm")
    found = {f"/dev/shm/{p.name}" for p in shm.iterdir()} if shm.is_dir() else set()
    return found | {str(p) for p in Path("/tmp").glob("pymp-*")}


@pytest.mark.alone  # the machine's /dev/shm, before and after
def test_a_run_of_hundreds_of_steps_times_and_counts_every_one(tmp_path):
    before = _leftovers()
    result = subprocess.run([sys.executable, str(REPO / "train.py"), *TINY, "--steps",
                             str(STEPS), "--num-workers", "2", "--out-dir", str(tmp_path),
                             "--run-name", "long"], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads((tmp_path / "long" / "summary.json").read_text())
    assert summary["steps_run"] == STEPS and len(summary["losses"]) == STEPS
    assert len(summary["step_times"]) == STEPS
    assert all(t["host_ms"] > 0 and t["data_ms"] >= 0 for t in summary["step_times"])
    settle = summary["config"]["settle"]
    rate = summary["sustained"]
    assert rate["steps"] == STEPS - settle and rate["timer"] == "host wall"
    # The rate is the samples over the summed step times, not over the profiled window.
    host = sum(t["host_ms"] for t in summary["step_times"][settle:])
    assert abs(rate["samples_per_s"] - 4 * (STEPS - settle) / host * 1e3) < 1e-6 * host
    assert summary["data_wait"]["steps"] == STEPS - settle
    assert summary["batches"] == {"loader": "ring", "copy": "in the step",
                                  "loader_rate": summary["batches"]["loader_rate"]}
    own = summary["batches"]["loader_rate"]
    assert own["workers"] == 2 and own["batches"] >= STEPS and own["batches_per_s"] > 0
    assert "sustained:" in result.stdout and "data wait (host):" in result.stdout
    assert _leftovers() <= before, sorted(_leftovers() - before)


# A dataset whose samples past the 40th batch (of 4) fail, in the data workers.
_FAILING = """
import sys
import data.synthetic as synthetic
real = synthetic.SyntheticFaces.__getitem__
def getitem(self, index):
    if index >= 160:
        raise ValueError(f"sample {index} is broken")
    return real(self, index)
synthetic.SyntheticFaces.__getitem__ = getitem
import train
sys.exit(train.main(sys.argv[1:]))
"""


@pytest.mark.alone  # the machine's /dev/shm, before and after
def test_a_workers_error_deep_into_a_run_leaves_nothing_behind(tmp_path):
    before = _leftovers()
    result = subprocess.run([sys.executable, "-c", _FAILING, *TINY, "--steps", str(STEPS),
                             "--num-workers", "2", "--out-dir", str(tmp_path),
                             "--run-name", "run"], cwd=REPO, capture_output=True,
                            text=True, timeout=600)
    lines = our_lines(result.stderr)
    assert result.returncode == 1, result.stderr[-3000:]
    assert len(lines) == 1 and "run failed at step 41 of 300" in lines[0], lines
    assert "sample 160 is broken" in lines[0]
    assert [p.name for p in tmp_path.iterdir()] == ["run-failed"]
    summary = json.loads((tmp_path / "run-failed" / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["completed_steps"] == 40
    assert gone(str(tmp_path))
    assert _leftovers() <= before, sorted(_leftovers() - before)


@pytest.mark.alone  # the machine's /dev/shm, before and after
def test_ctrl_c_deep_into_a_ring_run_leaves_nothing_behind(tmp_path):
    before = _leftovers()
    proc = start_long_run(tmp_path, "--num-workers", "2")
    code, lines = signal_after(proc, "step 120/401", signal.SIGINT)
    assert code == 130 and len(lines) == 1 and "interrupted (Ctrl-C)" in lines[0], lines
    assert [p.name for p in tmp_path.iterdir()] == ["run-interrupted"]
    assert gone(str(tmp_path))
    assert _leftovers() <= before, sorted(_leftovers() - before)
