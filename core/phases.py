"""A step's phase: a torch.profiler range (what the trace, the table and TensorBoard read)
and, where CUDA is, an NVTX range of the same name, so that Nsight Systems and Nsight
Compute (`--nvtx --nvtx-include "loss/"`) can find and filter the step's phases. A whole
step is an NVTX range alone, `step N` (the profiler marks it already, as ProfilerStep#N).

    with step_range(7), phase("forward"):
        ...

An NVTX push and pop cost about a microsecond each on the host when no tool listens; a
step opens up to eight phases."""

import contextlib


@contextlib.contextmanager
def phase(name: str):
    import torch  # here: train.py --help runs without torch (docs/layout.md)
    with torch.profiler.record_function(name), nvtx_range(name):
        yield


def step_range(step: int):
    """Step `step` (from 0) as an NVTX range, where CUDA is: `--nvtx-include "step 7/"`."""
    return nvtx_range(f"step {step}")


@contextlib.contextmanager
def nvtx_range(name: str):
    """An NVTX range where CUDA is; nothing elsewhere."""
    if not _nvtx():
        yield
        return
    import torch
    torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_pop()


_NVTX: list[bool] = []


def _nvtx() -> bool:
    """Whether this process marks NVTX ranges: where CUDA is available (asked once)."""
    if not _NVTX:
        import torch
        _NVTX.append(torch.cuda.is_available())
    return _NVTX[0]
