"""make ncu (studies/ncu.py) on CPU: ncu's raw CSV read into one row a kernel, and each
refusal one line with its exit code; the run itself is the GPU machine's."""

import subprocess
import sys

import pytest

from studies import ncu
from tests.helpers import REPO, SMALL, gpu_counters_alone, our_lines

# make ncu's run at the GPU tests' small size (its own short schedule kept).
SMALL_ARGS = SMALL[:SMALL.index("--wait")]

# ncu --csv --page raw as it writes it, written by hand in its format: its ==PROF==
# lines, a header of metric names, a row of units, a row a launch (two launches of one
# kernel, one of another).
RAW = (REPO / "tests" / "fixtures" / "ncu_raw_example.csv").read_text()


def test_the_raw_csv_is_one_row_a_kernel_slowest_first():
    rows = ncu.kernel_rows(ncu.read_raw(RAW))
    assert [r["kernel"] for r in rows] == [
        "giou_bwd_kernel<false, c10::BFloat16, float, float>",
        "giou_fwd_kernel<false, c10::BFloat16, float, float>"]
    bwd, fwd = rows
    assert bwd["duration us"] == 1020.0 and bwd["launches profiled"] == 1
    assert fwd["launches profiled"] == 2 and fwd["duration us"] == pytest.approx(12.5)
    assert fwd["DRAM % of peak"] == pytest.approx(42.5)
    assert fwd["achieved occupancy %"] == pytest.approx(62.0)
    assert fwd["registers a thread"] == 40 and fwd["block"] == "(256, 1, 1)"


def test_nanoseconds_are_read_as_such():
    raw = RAW.replace('"usecond"', '"nsecond"')
    (fwd,) = [r for r in ncu.kernel_rows(ncu.read_raw(raw)) if "fwd" in r["kernel"]]
    assert fwd["duration us"] == pytest.approx(0.0125)


def test_no_csv_is_no_rows():
    assert ncu.read_raw("==PROF== nothing profiled\n") == []


def _make_ncu(*args):
    done = subprocess.run([sys.executable, "-m", "studies.ncu", *args], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    return done.returncode, our_lines(done.stderr)


def test_a_strategy_without_a_kernel_is_refused():
    code, err = _make_ncu("--loss", "padded")
    assert code == 2 and err == ["error: make ncu profiles the fused loss kernels: "
                                 "LOSS=padded has none; choose one of kernel, conditional, "
                                 "packed"], err


def test_without_a_gpu_it_is_one_line():
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code, err = _make_ncu("--loss", "kernel")
    assert code == 2 and err == ["error: make ncu needs a GPU: Nsight Compute profiles "
                                 "CUDA kernels"], err


def test_without_ncu_it_is_one_line(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr(ncu.os, "access", lambda path, mode: False)
    with pytest.raises(ncu.UserError, match="make ncu needs Nsight Compute's `ncu`"):
        ncu.find_ncu()


def test_counters_the_driver_keeps_from_the_user_are_one_line(monkeypatch, tmp_path, capsys):
    """What ncu prints where NVreg_RestrictProfilingToAdminUsers is on: exit 1, one line."""
    fake = tmp_path / "ncu"
    fake.write_text("#!/bin/sh\necho '==ERROR== ERR_NVGPUCTRPERM - The user does not have "
                    "permission to access NVIDIA GPU Performance Counters'\nexit 1\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    assert ncu.main(["--loss", "kernel", "--out", str(tmp_path / "out")]) == 1
    err = our_lines(capsys.readouterr().err)
    assert err == ["error: ncu may not read this GPU's performance counters "
                   "(ERR_NVGPUCTRPERM): run it as root, or load the driver with "
                   "NVreg_RestrictProfilingToAdminUsers=0"], err


@pytest.mark.gpu
def test_make_ncu_on_the_gpu(tmp_path):
    """The real thing, where ncu is installed and may read the counters: a table of the
    fused kernels' forward, finalize and backward launches."""
    try:
        ncu.find_ncu()
    except ncu.UserError:
        pytest.skip("ncu is not installed here")
    with gpu_counters_alone():  # ncu runs side by side failed (exit 9)
        _make_ncu_on_the_gpu(tmp_path)


def _make_ncu_on_the_gpu(tmp_path):
    out = tmp_path / "ncu"
    done = subprocess.run([sys.executable, "-m", "studies.ncu", "--loss", "kernel",
                           "--backend", "cuda", "--out", str(out), *SMALL_ARGS],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    if done.returncode == 1 and "ERR_NVGPUCTRPERM" in done.stderr:
        pytest.skip(our_lines(done.stderr)[0])
    assert done.returncode == 0, done.stderr[-3000:]
    with (out / "ncu.csv").open() as f:
        kernels = [row["kernel"] for row in ncu.csv.DictReader(f)]
    assert {k.split("<")[0] for k in kernels} >= {"giou_fwd_kernel", "giou_bwd_kernel",
                                                  "giou_finalize_kernel"}, kernels
    assert (out / "report.ncu-rep").is_file()
    point = tmp_path / "point"
    done = subprocess.run([sys.executable, "-m", "studies.ncu", "--loss", "packed",
                           "--backend", "cuda", "--out", str(point), "--point", "64,64,full"],
                          cwd=REPO, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    with (point / "ncu.csv").open() as f:
        launches = {row["kernel"].split("<")[0]: int(row["launches profiled"])
                    for row in ncu.csv.DictReader(f)}
    assert launches and set(launches.values()) == {1 + ncu.POINT_CALLS}, launches
    assert "at batch, capacity, sigma 64,64,full" in (point / "ncu.md").read_text()


@pytest.mark.parametrize("point", ["1024,1024", "0,256,3", "8,8,-1", "a,b,c", "8,8,3,4"])
def test_a_point_that_is_no_point_is_one_line(point):
    code, err = _make_ncu("--loss", "kernel", "--point", point)
    assert code == 2 and err == ["error: --point takes BATCH,CAPACITY,SIGMA (whole numbers "
                                 "of at least 1, a sigma above 0 or 'full'), as "
                                 f"1024,1024,full; not {point!r}"], err


def test_a_point_with_training_options_is_one_line():
    code, err = _make_ncu("--loss", "kernel", "--point", "8,8,full", "--batch-size", "8")
    assert code == 2 and err == ["error: --point runs the loss alone: train.py's options "
                                 "(--batch-size 8) do not apply"], err


def test_the_point_ncu_profiles_runs_the_loss_and_its_backward(monkeypatch):
    """The child process's work, on the CPU (Triton's interpreter): the point's calls."""
    from studies import sweep_point
    calls = []
    real = sweep_point.loss_call
    monkeypatch.setattr(sweep_point, "loss_call", lambda *a: calls.append(a) or real(*a))
    ncu.call_point("kernel", "triton", "4,8,full", device="cpu")
    ((strategy, pred, targets),) = calls
    assert pred.shape == (4, 8, 4) and pred.grad is not None


def test_an_out_that_holds_a_table_is_never_overwritten(tmp_path, monkeypatch):
    (tmp_path / "ncu.md").write_text("an earlier table\n")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr(ncu, "find_ncu", lambda: "/bin/false")
    with pytest.raises(ncu.UserError, match="already holds a ncu"):
        ncu._main(["--loss", "kernel", "--out", str(tmp_path)])
    assert (tmp_path / "ncu.md").read_text() == "an earlier table\n"
