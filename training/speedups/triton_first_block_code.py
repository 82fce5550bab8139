"""The first block's backward from the pool's code (kernels/trunk/first_block_bwd.py): the
forward also writes which window position won for each pooled value (4 bytes a pooled
pixel, 67 MB at batch 1024), and the weight and bias gradients read it instead of
recomputing the conv from the image (144 FMAs and the window's scan a pooled pixel):
21 selects and 10 FMAs a channel. It swaps triton_first_block's forward again, keeping
the code, so without that one it is off."""

from training.speedups.base import SpeedUp
from training.speedups.triton_first_block import swap


def turn_on(model, build) -> None:
    swap(model, build, keep_code=True)


SPEEDUP = SpeedUp(
    "triton_first_block_code",
    "with --triton-first-block, its forward keeps the pool's code and its backward reads "
    "it instead of recomputing the conv",
    interpreter_slow=True, model=turn_on,
    idle=lambda asked, on: None if on["triton_first_block"] else
    "it reads --triton-first-block's forward, which is off")
