"""kernel and conditional: one fused GIoU kernel over the padded batch (Triton or CUDA).

`kernel` computes every slot and zeroes the invalid ones (the original's design);
`conditional` skips the slots past each sample's count: they are never loaded or
computed, and its backward only writes their zero gradients (both backends' kernels walk
chunks of 1024 slots up to the count and write the rest of the chunk as zero rows).
"""

from functools import partial

from data import collate_padded
from kernels.giou import bind_loss
from losses.strategy import Strategy, tensors_to_device


def _make(name: str, conditional: bool, capacity: int, backend: str) -> Strategy:
    # Binding resolves the backend once (and builds the CUDA extension on first use), so
    # a loss call is the input check and the op.
    giou = bind_loss(backend, conditional)

    def fused_loss(pred, targets):
        boxes, counts = targets
        return giou(pred, boxes, counts)

    return Strategy(name, partial(collate_padded, capacity=capacity), tensors_to_device,
                    fused_loss, needs_cuda=backend == "cuda")


make_kernel = partial(_make, "kernel", False)
make_conditional = partial(_make, "conditional", True)
