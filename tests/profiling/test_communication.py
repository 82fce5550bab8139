"""profiling/communication.py on a made-up trace whose answer is known by hand, and on the
real two-H200 fixture."""

import json

import pytest

from profiling.communication import communication, intersection, merge
from profiling.trace_events import load_trace
from tests.helpers import FIXTURES

PHASES = ("loss", "backward", "optimizer")


def _host(name, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}


def _launch(ts, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": ts, "dur": 1,
            "args": {"correlation": corr}}


def _kernel(name, ts, dur, corr):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur,
            "args": {"correlation": corr}}


def _step(offset: float) -> list[dict]:
    """One step: a compute kernel 100-200 (launched in backward), an all-reduce 150-250
    launched in backward (half of it beside the compute kernel), a small all-reduce
    launched in the loss at 300-310 alone."""
    o = offset
    return [_host(f"ProfilerStep#{int(o)}", o, 1000), _host("loss", o + 1, 9),
            _host("backward", o + 10, 20), _launch(o + 2, o + 1), _launch(o + 11, o + 2),
            _launch(o + 12, o + 3),
            _kernel("ncclDevKernel_AllReduce_Sum_f64_RING_LL", o + 300, 10, o + 1),
            _kernel("compute_kernel", o + 100, 100, o + 2),
            _kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", o + 150, 100, o + 3)]


def test_communication_of_a_made_up_trace():
    events = _step(0) + _step(10_000)
    got = communication(events, PHASES)
    # Per step: 110 us of NCCL kernels, 50 of it beside the compute kernel.
    assert got["gpu"] and got["collectives"] == 2
    assert got["comm_ms"] == pytest.approx(0.110)
    assert got["overlapped_ms"] == pytest.approx(0.050)
    assert got["exposed_ms"] == pytest.approx(0.060)
    assert got["by_phase_ms"] == pytest.approx({"backward": 0.100, "loss": 0.010})
    # max_steps: only the first step.
    assert communication(events, PHASES, max_steps=1)["comm_ms"] == pytest.approx(0.110)


def test_interval_helpers():
    assert merge([(5, 7), (0, 2), (1, 3), (7, 8)]) == [(0, 3), (5, 8)]
    assert intersection([(0, 3), (5, 8)], [(2, 6), (7, 10)]) == 1 + 1 + 1


def test_the_fixtures_figures_are_the_ones_in_its_summary():
    """The two-H200 fixture's summary.json was written by the run from these traces."""
    summary = json.loads((FIXTURES / "gpu_ddp_train.summary.json").read_text())
    phases = tuple(summary["phases"])
    for rank in (0, 1):
        events = load_trace(FIXTURES / f"gpu_ddp_rank{rank}.pt.trace.json.gz")
        got = communication(events, phases)
        expected = summary["distributed"]["ranks"][rank]["communication"]
        assert got.pop("by_phase_ms") == pytest.approx(expected.pop("by_phase_ms"))
        assert got == pytest.approx(expected)
