"""The trace -> table code, on hand-made events (CPU) and on a real GPU trace from the
device (tests/fixtures/, a few steps of a small batch)."""

import json

import pytest

from profiling.trace_events import load_trace
from profiling.trace_summary import summarize
from tests.helpers import FIXTURES


def _x(cat, name, ts, dur, **args):
    return {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "args": args}


def test_events_are_attributed_to_the_phase_that_launched_them():
    events = [
        _x("user_annotation", "ProfilerStep#3", 0, 100),
        _x("user_annotation", "copy", 1, 9),
        _x("user_annotation", "loss", 10, 20),
        _x("gpu_user_annotation", "loss", 40, 50),  # the GPU twin: ignored
        _x("cuda_runtime", "cudaMemcpyAsync", 2, 1, correlation=1),
        _x("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 3, 4, correlation=1),
        _x("cuda_runtime", "cudaLaunchKernel", 12, 1, correlation=2),
        _x("cuda_driver", "cuLaunchKernelEx", 14, 1, correlation=3),
        _x("cuda_runtime", "cudaStreamSynchronize", 20, 5),
        _x("kernel", "_giou_fwd_kernel", 30, 2.5, correlation=2),
        _x("kernel", "_giou_finalize_kernel", 33, 1.5, correlation=3),
        _x("kernel", "stray", 90, 7, correlation=99),  # launched outside any phase
    ]
    s = summarize(events, ("copy", "loss"))
    assert s["steps"] == 1
    copy, loss = s["phases"]["copy"], s["phases"]["loss"]
    assert copy.pop("cpu_ms_each") == pytest.approx([0.009])
    assert loss.pop("cpu_ms_each") == pytest.approx([0.020])
    assert copy == pytest.approx(
        {"cpu_ms": 0.009, "gpu_ms": 0.004, "launches": 0, "h2d_copies": 1, "syncs": 0})
    assert loss == pytest.approx(
        {"cpu_ms": 0.020, "gpu_ms": 0.004, "launches": 2, "h2d_copies": 0, "syncs": 1})
    assert s["step"]["cpu_ms"] == pytest.approx(0.1)
    assert s["step"]["cpu_ms_each"] == pytest.approx([0.1])


def test_a_steps_busy_time_counts_overlapping_streams_once():
    """Two steps, each launching an update on a side stream that runs beside its trunk and
    on past the step (lin1's update beside the trunk does): summed over streams it counts
    twice; the union counts it once, and ends with the window's compute stream (the last
    update's tail is the next step's, as the first trunk ran beside an earlier update)."""
    events = [
        _x("user_annotation", "ProfilerStep#1", 0, 100),
        _x("user_annotation", "ProfilerStep#2", 100, 100),
        *(_x("cuda_runtime", "cudaLaunchKernel", t, 1, correlation=c)
          for t, c in ((1, 1), (2, 2), (101, 3), (102, 4))),
        _x("kernel", "trunk", 10, 90, correlation=1, stream=7),
        _x("kernel", "update", 60, 70, correlation=2, stream=45),   # 40 beside, 30 past
        _x("kernel", "trunk", 110, 90, correlation=3, stream=7),
        _x("kernel", "update", 160, 70, correlation=4, stream=45),  # 30 past the window
    ]
    step = summarize(events, ())["step"]
    assert step["gpu_ms"] == pytest.approx(0.16)             # (90 + 70 + 90 + 70) / 2
    assert step["busiest_stream_ms"] == pytest.approx(0.09)
    # [10, 200] (the first update fills the trunks' gap [100, 110]), over 2 steps
    assert step["busy_ms"] == pytest.approx(0.095)


def test_with_three_steps_or_more_the_busy_time_is_the_steady_states():
    """Four steps of a trunk (90) and an update beside it (70) that runs on into the next
    step: the first step's trunk runs alone (the update before the window had ended), the
    others beside the update before them, 20 slower. The steady state is the periods from
    the second step's trunk to the last's: [120, 360] busy over 2 periods, 120 a step; the
    window's union to the compute stream's end (the two-step rule) would read 115."""
    events = [_x("user_annotation", f"ProfilerStep#{k}", 100 * k, 100) for k in range(4)]
    trunk = [(10, 90), (120, 110), (240, 110), (360, 110)]  # starts 10, then 120 a period
    for k, (start, dur) in enumerate(trunk):
        events += [_x("cuda_runtime", "cudaLaunchKernel", 100 * k + 1, 1,
                      correlation=2 * k + 1),
                   _x("cuda_runtime", "cudaLaunchKernel", 100 * k + 2, 1,
                      correlation=2 * k + 2),
                   _x("kernel", "trunk", start, dur, correlation=2 * k + 1, stream=7),
                   _x("kernel", "update", start + 60, 70, correlation=2 * k + 2,
                      stream=45)]
    step = summarize(events, ())["step"]
    assert step["busy_ms"] == pytest.approx(0.120)


def test_each_steps_time_is_kept_in_order_and_averages_to_the_mean():
    events = [_x("user_annotation", "ProfilerStep#4", 200, 90),
              _x("user_annotation", "loss", 250, 30),
              _x("user_annotation", "ProfilerStep#3", 0, 100),
              _x("user_annotation", "loss", 10, 5)]
    s = summarize(events, ("loss",))
    assert s["phases"]["loss"]["cpu_ms_each"] == pytest.approx([0.005, 0.030])
    assert s["phases"]["loss"]["cpu_ms"] == pytest.approx(0.0175)
    assert s["step"]["cpu_ms_each"] == pytest.approx([0.1, 0.09])


def _fixture(name):
    trace = FIXTURES / f"{name}.pt.trace.json.gz"
    assert trace.exists(), f"{trace} is missing: bench/record_fixtures.sh records it on a GPU"
    recorded = json.loads((FIXTURES / f"{name}.summary.json").read_text())
    return load_trace(trace), recorded


@pytest.mark.parametrize("name", ["gpu_padded_train", "gpu_kernel_train"])
def test_real_gpu_trace(name):
    """A real CUDA trace (torch 2.11 on the H100): key_averages() has a zero-CPU-time twin
    row per range there; the trace parser must give every phase its real numbers."""
    events, recorded = _fixture(name)
    s = summarize(events, tuple(recorded["phases"]))
    for phase, numbers in recorded["phases"].items():  # the numbers the device printed
        assert {k: s["phases"][phase][k] for k in numbers} == pytest.approx(numbers), phase
    phases = s["phases"]
    for phase in ("forward", "loss", "loss_backward", "backward", "optimizer"):
        assert phases[phase]["gpu_ms"] > 0, phase
        assert phases[phase]["cpu_ms"] > 0, phase
        assert phases[phase]["launches"] >= 1, phase
    assert phases["copy"]["h2d_copies"] == 3  # images, padded boxes, counts
    assert phases["copy"]["launches"] == 0
    for phase in ("copy", "forward", "loss", "loss_backward", "backward", "optimizer"):
        assert phases[phase]["syncs"] == 0, phase  # train mode: no sync inside a phase
    if name == "gpu_kernel_train":  # the fused Triton kernel: forward + finalize, backward
        assert phases["loss"]["launches"] == 2
        assert phases["loss_backward"]["launches"] == 1
    assert s["step"]["gpu_ms"] >= sum(p["gpu_ms"] for p in phases.values()) * 0.99
    # The copy ahead runs beside the compute: the union is at most the sum over streams
    # and at least the compute stream's work (to the trace's rounding: a kernel's end, at
    # its microsecond's fraction, can pass the next one's start by nanoseconds, and the
    # ends' sums round at the timestamps' size).
    step = s["step"]
    assert step["busiest_stream_ms"] * (1 - 1e-4) <= step["busy_ms"] <= \
        step["gpu_ms"] * (1 + 1e-4)
