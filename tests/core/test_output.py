"""A closed output pipe (`make profile | head`, `make throughput | head -6`) is the user's
choice: the runs go on to their end, their folders whole, exit 0, no traceback
(core/output.py)."""

import json
import subprocess
import sys

from tests.helpers import REPO, TINY


def _piped(args: list[str], lines: int) -> tuple[int, str]:
    """The command's exit code and stderr when a reader takes `lines` lines and goes."""
    proc = subprocess.Popen([sys.executable, "-u", *args], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    for _ in range(lines):
        proc.stdout.readline()
    proc.stdout.close()  # the reader goes, as head does
    err = proc.stderr.read()
    return proc.wait(timeout=300), err


def test_a_run_whose_reader_went_ends_whole(tmp_path):
    code, err = _piped(["train.py", *TINY, "--active", "6", "--out-dir", str(tmp_path),
                        "--run-name", "job"], 1)
    assert code == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
    summary = json.loads((tmp_path / "job" / "summary.json").read_text())
    assert summary["status"] == "complete"
    assert [p.name for p in tmp_path.iterdir()] == ["job"]


def test_make_throughput_whose_reader_went_makes_every_run(tmp_path):
    out = tmp_path / "tp"
    code, err = _piped(["-m", "studies.throughput", "--out", str(out), "--strategies",
                        "padded,concat", *TINY, "--dataset-length", "40"], 2)
    assert code == 0 and "Traceback" not in err and "BrokenPipe" not in err, err
    assert (out / "throughput.md").exists() and (out / "padded" / "summary.json").exists()
    assert (out / "concat" / "summary.json").exists()
