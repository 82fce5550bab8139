"""core/phases.py: a step's phase is a profiler range, and where CUDA is an NVTX range of
the same name, closed however the phase ends."""

import pytest
import torch

from core import phases


def test_a_phase_is_an_nvtx_range_where_cuda_is(monkeypatch):
    said = []
    monkeypatch.setattr(phases, "_NVTX", [True])
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: said.append(f"+{name}"))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: said.append("-"))
    with phases.phase("backward"):
        with phases.phase("optimizer"):
            pass
    with pytest.raises(ValueError), phases.phase("loss"):
        raise ValueError("a failing step still closes its range")
    assert said == ["+backward", "+optimizer", "-", "-", "+loss", "-"]


def test_each_step_of_a_run_is_an_nvtx_range_around_its_phases(monkeypatch, tmp_path):
    """A run's every step, its phases inside, as Nsight Systems would see the pushes and
    pops (NVTX recorded by hand: no CUDA here)."""
    import train
    from tests.helpers import TINY
    said = []
    monkeypatch.setattr(phases, "_NVTX", [True])
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: said.append(name))
    monkeypatch.setattr(torch.cuda.nvtx, "range_pop", lambda: said.append("-"))
    train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path)]))
    steps = [name for name in said if name.startswith("step ")]
    assert steps == ["step 0", "step 1", "step 2"], said
    first = said[said.index("step 0"):said.index("step 1")]
    assert {"forward", "loss", "backward", "optimizer"} <= set(first), first
    assert first.count("-") == len(first) - first.count("-")  # each push popped inside it


def test_without_cuda_a_phase_is_the_profilers_range_alone(monkeypatch):
    monkeypatch.setattr(phases, "_NVTX", [False])
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: pytest.fail("NVTX"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with phases.phase("forward"):
            torch.ones(2).sum()
    assert "forward" in {e.name for e in prof.events()}


@pytest.mark.gpu
def test_ncu_profiles_one_phases_kernels_by_its_nvtx_range(tmp_path):
    """On the device, the ranges are what Nsight Compute filters by: under `--nvtx
    --nvtx-include loss/` it profiles the fused loss's forward kernels and none of the same
    step's others: not the loss's backward kernel (in loss_backward), not a GEMM."""
    import os
    import subprocess
    import sys

    from studies import ncu
    from tests.helpers import REPO, SMALL
    try:
        tool = ncu.find_ncu()
    except ncu.UserError:
        pytest.skip("ncu is not installed here")
    raw, scratch = tmp_path / "raw.csv", tmp_path / "scratch"
    scratch.mkdir()  # ncu leaves a folder of its own (nvidia/) in TMPDIR: a private one
    done = subprocess.run(
        [tool, "--target-processes", "all", "--nvtx", "--nvtx-include", "loss/",
         "--metrics", "gpu__time_duration.sum", "--csv", "--page", "raw", "--log-file",
         str(raw), sys.executable, "train.py", *SMALL, "--loss", "kernel", "--backend",
         "cuda", "--out-dir", str(tmp_path / "runs")],
        cwd=REPO, capture_output=True, text=True, timeout=600,
        env={**os.environ, "TMPDIR": str(scratch)})
    if "ERR_NVGPUCTRPERM" in done.stdout + done.stderr:
        pytest.skip("ncu may not read this GPU's counters")
    assert done.returncode == 0, done.stderr[-3000:]
    kernels = {ncu.short_name(k["Kernel Name"]).split("<")[0]
               for k in ncu.read_raw(raw.read_text())}
    assert "giou_fwd_kernel" in kernels, kernels
    assert "giou_bwd_kernel" not in kernels, kernels
    assert not {k for k in kernels if "gemm" in k.lower() or "nvjet" in k}, kernels
