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


def test_without_cuda_a_phase_is_the_profilers_range_alone(monkeypatch):
    monkeypatch.setattr(phases, "_NVTX", [False])
    monkeypatch.setattr(torch.cuda.nvtx, "range_push", lambda name: pytest.fail("NVTX"))
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with phases.phase("forward"):
            torch.ones(2).sum()
    assert "forward" in {e.name for e in prof.events()}
