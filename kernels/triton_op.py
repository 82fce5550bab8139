"""How every Triton kernel here becomes a torch custom op, on a GPU and in the interpreter.

    @define_op("giou::triton_loss", mutates_args=())
    def triton_loss(...):
        launch(_giou_fwd_kernel, grid, *args, **meta)

On a GPU the launchers are a torch.library.triton_op, which torch.compile decomposes so
that Inductor sees the kernels themselves. Under Triton's interpreter (TRITON_INTERPRET=1,
the CPU tests) torch cannot trace into the kernels (wrap_triton hands back the raw
kernel), so the launchers are an opaque custom_op, and each op registers an explicit fake.
"""

import torch
import triton
from torch.library import triton_op, wrap_triton


@triton.jit
def _probe():
    pass


def _is_interpreted(kernel) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(kernel, InterpretedFunction)


INTERPRETED = _is_interpreted(_probe)
define_op = torch.library.custom_op if INTERPRETED else triton_op


def launch(kernel, grid, *args, **meta) -> None:
    """Launches a @triton.jit kernel from inside a define_op function."""
    if INTERPRETED:
        kernel[grid](*args, **meta)
    else:
        wrap_triton(kernel)[grid](*args, **meta)


def is_nhwc(x: torch.Tensor) -> bool:
    """Whether x is laid out channels_last (and not also plainly contiguous, as a tensor of
    one channel or one pixel is): the layout a kernel's outputs and gradients keep."""
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def empty_4d(shape, dtype, device, channels_last: bool) -> torch.Tensor:
    """An uninitialised [B, C, H, W] tensor, NHWC where channels_last, made with explicit
    strides: torch.compile turns torch.empty(..., memory_format=torch.channels_last) in a
    triton_op into a kernel that writes the whole tensor (0.04 ms for 134 MB on the H100,
    0.16 ms for 537 MB: bench/trunk_kernels.py), empty_strided into an allocation."""
    B, C, H, W = shape
    strides = (H * W * C, 1, W * C, C) if channels_last else (C * H * W, H * W, W, 1)
    return torch.empty_strided(shape, strides, dtype=dtype, device=device)
