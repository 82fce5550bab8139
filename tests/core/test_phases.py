"""core/phases.py: a step's phase is a profiler range, and under --nvtx where CUDA is an
NVTX start/end range of the same name, closed however the phase ends."""

import pytest
import torch

from core import phases


def _record_nvtx(monkeypatch) -> list[str]:
    """NVTX's starts and ends as "+name" and "-name" (recorded by hand: no CUDA here)."""
    said, names = [], {}

    def start(name):
        said.append(f"+{name}")
        names[len(names)] = name
        return len(names) - 1
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", start)
    monkeypatch.setattr(torch.cuda.nvtx, "range_end", lambda i: said.append(f"-{names[i]}"))
    return said


def test_a_phase_is_an_nvtx_range_under_nvtx(monkeypatch):
    said = _record_nvtx(monkeypatch)
    monkeypatch.setattr(phases, "_cuda", lambda: True)
    monkeypatch.setattr(phases, "_ON", [False])
    phases.mark_nvtx(True)
    with phases.phase("backward"):
        with phases.phase("optimizer"):
            pass
    with pytest.raises(ValueError), phases.phase("loss"):
        raise ValueError("a failing step still closes its range")
    assert said == ["+backward", "+optimizer", "-optimizer", "-backward", "+loss", "-loss"]


@pytest.mark.parametrize("nvtx", [True, False])
def test_each_step_of_a_run_is_an_nvtx_range_around_its_phases_under_nvtx(
        monkeypatch, tmp_path, nvtx):
    """A run's every step, its phases inside, as Nsight Systems would see the ranges; none
    without --nvtx."""
    import train
    from tests.helpers import TINY
    said = _record_nvtx(monkeypatch)
    monkeypatch.setattr(phases, "_cuda", lambda: True)  # the ranges as a GPU's run marks them
    monkeypatch.setattr(phases, "_ON", [False])
    train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path)] + ["--nvtx"] * nvtx))
    if not nvtx:
        assert said == []
        return
    steps = [name for name in said if name.startswith("+step ")]
    assert steps == ["+step 0", "+step 1", "+step 2"], said
    first = said[said.index("+step 0"):said.index("-step 0") + 1]
    assert {"+forward", "+loss", "+loss_backward", "+backward", "+optimizer"} <= set(first)
    assert sorted(n[1:] for n in first if n[0] == "+") == sorted(
        n[1:] for n in first if n[0] == "-"), first  # each range ended inside its step


def test_without_cuda_a_phase_is_the_profilers_range_alone(monkeypatch):
    monkeypatch.setattr(phases, "_cuda", lambda: False)
    monkeypatch.setattr(phases, "_ON", [False])
    phases.mark_nvtx(True)
    monkeypatch.setattr(torch.cuda.nvtx, "range_start", lambda name: pytest.fail("NVTX"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with phases.phase("forward"):
            torch.ones(2).sum()
    assert "forward" in {e.name for e in prof.events()}


@pytest.mark.gpu
def test_ncu_profiles_one_phases_kernels_by_its_nvtx_range(tmp_path):
    """On the device, the ranges are what Nsight Compute filters by: under `--nvtx
    --nvtx-include <phase>` it profiles that phase's kernels and none of the step's
    others: the fused loss's forward kernel alone in loss, its backward kernel alone in
    loss_backward, and in backward (launched from autograd's own thread) the model's
    GEMMs and no loss kernel. The three ncu runs one after the other, alone with the GPU's
    counters (tests.helpers.gpu_counters_alone)."""
    from studies import ncu
    from tests.helpers import gpu_counters_alone
    try:
        tool = ncu.find_ncu()
    except ncu.UserError:
        pytest.skip("ncu is not installed here")
    with gpu_counters_alone():
        loss = _kernels_under_ncu(tool, "loss", tmp_path / "loss")
        loss_backward = _kernels_under_ncu(tool, "loss_backward", tmp_path / "loss_backward")
        backward = _kernels_under_ncu(tool, "backward", tmp_path / "backward")
    assert "giou_fwd_kernel" in loss and "giou_bwd_kernel" not in loss, loss
    assert "giou_bwd_kernel" in loss_backward and "giou_fwd_kernel" not in loss_backward, \
        loss_backward
    assert not _gemms(loss) and not _gemms(loss_backward), (loss, loss_backward)
    assert _gemms(backward) and not any("giou" in k for k in backward), backward


def _gemms(kernels: set[str]) -> set[str]:
    return {k for k in kernels if "gemm" in k or "nvjet" in k}


def _kernels_under_ncu(tool: str, phase: str, folder) -> set[str]:
    """The short names (lower case) of the kernels ncu profiled within the NVTX range
    `phase` of a small kernel/cuda run under --nvtx."""
    import os
    import subprocess
    import sys

    from studies import ncu
    from tests.helpers import REPO, SMALL
    raw, scratch = folder / "raw.csv", folder / "scratch"
    scratch.mkdir(parents=True)  # ncu leaves a folder of its own (nvidia/) in TMPDIR
    done = subprocess.run(
        [tool, "--target-processes", "all", "--nvtx", "--nvtx-include", phase,
         "--metrics", "gpu__time_duration.sum", "--csv", "--page", "raw", "--log-file",
         str(raw), sys.executable, "train.py", *SMALL, "--loss", "kernel", "--backend",
         "cuda", "--nvtx", "--out-dir", str(folder / "runs")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TMPDIR": str(scratch)})
    if "ERR_NVGPUCTRPERM" in done.stdout + done.stderr:
        pytest.skip("ncu may not read this GPU's counters")
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
    return {ncu.short_name(k["Kernel Name"]).split("<")[0].lower()
            for k in ncu.read_raw(raw.read_text())}
