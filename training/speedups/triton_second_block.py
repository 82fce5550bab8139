"""The second block (conv 4->16 -> 2x2 max-pool -> ReLU) as one Triton kernel forward, of
four tensor-core dots per block of pooled pixels (the conv's output never leaves
registers), and two backward (kernels/trunk/second_block.py): cuDNN's kernels for 4 input
channels waste most of their tiles. In the dtype of its input, as autocast runs the conv."""

from training.speedups.base import SpeedUp, rebind


def swap(model, build) -> None:
    from kernels.trunk.second_block import second_block

    def forward(block, x):
        conv = block[0]
        return second_block(x, conv.weight, conv.bias)
    rebind(model.block("second"), forward)


SPEEDUP = SpeedUp(
    "triton_second_block",
    "the second conv -> max-pool -> ReLU block as Triton kernels (one forward, two backward)",
    interpreter_slow=True, model=swap)
