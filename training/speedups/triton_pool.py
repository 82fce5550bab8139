"""The third and fourth blocks' bias, 2x2 max-pool and ReLU as one Triton kernel forward and
one backward around cuDNN's conv, which runs without its bias (kernels/trunk/pool.py):
compiled, Inductor added the bias over the full-resolution conv output in a pass of its
own, and the pool's backward wrote the full-resolution gradient at a third of HBM's rate.
The last block writes its output contiguous, so that lin1's flatten is a view. The same
forward as the compiled step's at the GPU preset, bit for bit."""

from training.speedups.base import SpeedUp, rebind


def swap(model, build) -> None:
    import torch.nn.functional as F

    from kernels.trunk.pool import pool_bias_relu

    def pooled(flat: bool):
        def forward(block, x):
            conv = block[0]
            x = F.conv2d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation,
                         conv.groups)
            return pool_bias_relu(x, conv.bias, flat=flat)
        return forward
    rebind(model.block("third"), pooled(flat=False))
    rebind(model.block("fourth"), pooled(flat=True))


SPEEDUP = SpeedUp(
    "triton_pool",
    "the third and fourth blocks' bias, max-pool and ReLU as one Triton kernel forward and "
    "one backward around cuDNN's bias-free conv",
    interpreter_slow=True, model=swap)
