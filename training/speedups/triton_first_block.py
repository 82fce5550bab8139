"""The first block (uint8 image -> /255 -> conv 1->4 -> 2x2 max-pool -> ReLU) as one Triton
kernel forward and one backward (kernels/trunk/first_block.py): cuDNN has no good kernel
for one input channel, and here the conv's full-resolution output never leaves registers.
The kernel reads the uint8 image itself, so the model's pixel scaling goes; it writes the
dtype that autocast gives the conv, in the layout of the second block's conv weight."""

from training.speedups.base import SpeedUp, rebind


def swap(model, build, keep_code: bool = False) -> None:
    """keep_code: the forward also writes the pool's code for the backward
    (triton_first_block_code, which swaps the block again with it)."""
    import torch

    from kernels.triton_op import is_nhwc
    from kernels.trunk.first_block import first_block
    dtype = build.autocast_dtype
    nhwc = is_nhwc(model.block("second")[0].weight)  # after channels_last, if that is on
    model.pixels = torch.nn.Identity()  # the kernel reads the uint8 pixels

    def forward(block, images):
        conv = block[0]
        return first_block(images, conv.weight, conv.bias, dtype, nhwc, keep_code)
    rebind(model.block("first"), forward)


SPEEDUP = SpeedUp(
    "triton_first_block",
    "the first conv -> max-pool -> ReLU block as one Triton kernel forward and one backward "
    "(its backward recomputes the conv, unless --triton-first-block-code)",
    interpreter_slow=True, model=swap)
