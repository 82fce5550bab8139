"""The third block's backward from its pooled gradient and the forward's pool code, in two
Triton kernels (kernels/trunk/conv_pool_bwd.py): the pool's backward wrote the
full-resolution gradient (537 MB at batch 1024), which cuDNN's input and weight gradients
read back. It reads triton_conv_pool's code, and swaps that forward again with its
backward, so without that one it is off."""

from training.speedups.base import SpeedUp
from training.speedups.triton_conv_pool import swap


def turn_on(model, build) -> None:
    swap(model, build, triton_backward=True)


SPEEDUP = SpeedUp(
    "triton_conv_pool_bwd",
    "with --triton-conv-pool, that block's backward as two Triton kernels from the pooled "
    "gradient and the pool's code",
    interpreter_slow=True, model=turn_on,
    idle=lambda asked, on: None if on["triton_conv_pool"] else
    "it reads --triton-conv-pool's pool code, which is off")
