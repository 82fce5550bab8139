"""kernel and conditional: one fused GIoU kernel over the padded batch (Triton or CUDA).

`kernel` computes every slot and zeroes the invalid ones (the original's design);
`conditional` skips the slots past each sample's count, so whole blocks of empty slots
are never loaded or computed.
"""

from functools import partial

from data import collate_padded
from losses.strategy import Strategy, padded_to_device

FUSED = ("kernel", "conditional")  # the strategies whose kernel backend is chosen


def _fused_loss(pred, targets, backend: str, conditional: bool):
    from kernels import giou_loss  # imported on use: the CUDA backend builds on first use
    boxes, counts = targets
    return giou_loss(pred, boxes, counts, backend=backend, conditional=conditional)


def _make(name: str, conditional: bool, capacity: int, kernel: str) -> Strategy:
    from kernels import check_backend
    check_backend(kernel)
    return Strategy(name, partial(collate_padded, capacity=capacity), padded_to_device,
                    partial(_fused_loss, backend=kernel, conditional=conditional),
                    needs_cuda=kernel == "cuda")


make_kernel = partial(_make, "kernel", False)
make_conditional = partial(_make, "conditional", True)
