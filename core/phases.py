"""A step's phase: a torch.profiler range and, under --nvtx where CUDA is, an NVTX range of the
same name, for Nsight Systems and Nsight Compute to find and filter (`with step_range(7),
phase("forward"):`). The NVTX ranges are start/end ranges, not push/pop ones, so that they
hold the backward's kernels, which autograd launches from a thread of its own. The design
in full: docs/design.md, this module's section."""

import contextlib


@contextlib.contextmanager
def phase(name: str):
    import torch  # here: train.py --help runs without torch (docs/layout.md)
    with torch.profiler.record_function(name), nvtx_range(name):
        yield


def step_range(step: int):
    """Step `step` (from 0) as an NVTX range under --nvtx: `--nvtx-include "step 7"`."""
    return nvtx_range(f"step {step}")


@contextlib.contextmanager
def nvtx_range(name: str):
    """An NVTX start/end range under --nvtx where CUDA is; nothing otherwise."""
    if not _ON[0]:
        yield
        return
    import torch
    handle = torch.cuda.nvtx.range_start(name)
    try:
        yield
    finally:
        torch.cuda.nvtx.range_end(handle)


_ON: list[bool] = [False]


def mark_nvtx(on: bool) -> None:
    """--nvtx: from now on (or, False, no longer) each phase and step is an NVTX range,
    where CUDA is; a CPU has no NVTX to mark."""
    _ON[0] = bool(on) and _cuda()


def _cuda() -> bool:
    import torch
    return torch.cuda.is_available()
