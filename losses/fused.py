"""kernel and conditional: one fused GIoU kernel over the padded batch (Triton or CUDA).

`kernel` computes every slot and zeroes the invalid ones (the original's design);
`conditional` skips the slots past each sample's count, so whole blocks of empty slots
are never loaded or computed.
"""

from functools import partial

from data import collate_padded
from losses.strategy import Strategy, padded_to_device

FUSED = ("kernel", "conditional")  # the strategies whose kernel backend is chosen


def _make(name: str, conditional: bool, capacity: int, kernel: str) -> Strategy:
    # Imported here, not at module top: importing kernels picks Triton's interpreter on a
    # CPU machine, which only the fused strategies need. Binding resolves the backend once
    # (and builds the CUDA extension on first use), so a loss call is the check and the op.
    from kernels import bind_loss
    giou = bind_loss(kernel, conditional)

    def fused_loss(pred, targets):
        boxes, counts = targets
        return giou(pred, boxes, counts)

    return Strategy(name, partial(collate_padded, capacity=capacity), padded_to_device,
                    fused_loss, needs_cuda=kernel == "cuda")


make_kernel = partial(_make, "kernel", False)
make_conditional = partial(_make, "conditional", True)
