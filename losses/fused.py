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
    # CPU machine, which only the fused strategies need. (The CUDA backend still builds on
    # its first call, not here.)
    from kernels import check_backend, giou_loss
    check_backend(kernel)

    def fused_loss(pred, targets):
        boxes, counts = targets
        return giou_loss(pred, boxes, counts, backend=kernel, conditional=conditional)

    return Strategy(name, partial(collate_padded, capacity=capacity), padded_to_device,
                    fused_loss, needs_cuda=kernel == "cuda")


make_kernel = partial(_make, "kernel", False)
make_conditional = partial(_make, "conditional", True)
