"""The third block's forward (conv 16->64, bias, 2x2 max-pool, ReLU, and the pool's code)
as one persistent Triton kernel of tensor-core dots (kernels/trunk/conv_pool.py): cuDNN's
conv wrote its full-resolution output (537 MB at batch 1024) for the pool to read back.
Its backward is the pool's and cuDNN's (kernels/trunk/pool.py), unless
triton_conv_pool_bwd turns on the Triton one."""

from training.speedups.base import SpeedUp, rebind


def swap(model, build, triton_backward: bool = False) -> None:
    """triton_backward: the block's backward as Triton kernels too (triton_conv_pool_bwd,
    which swaps the block again with it)."""
    from kernels.trunk.conv_pool import conv_pool_bias_relu

    def forward(block, x):
        conv = block[0]
        return conv_pool_bias_relu(x, conv.weight, conv.bias, triton_backward)
    rebind(model.block("third"), forward)


SPEEDUP = SpeedUp(
    "triton_conv_pool",
    "the third block's conv, bias, max-pool and ReLU forward as one Triton kernel (its "
    "backward: --triton-conv-pool-bwd's, or the pool's and cuDNN's)",
    interpreter_slow=True, model=swap)
