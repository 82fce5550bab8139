"""packed: every valid box of the batch in one [N, 4] tensor with each box's image and slot
(the layout ultralytics' YOLO trainers collate) and per-image offsets, and fused kernels
(Triton or CUDA: kernels/triton_packed.py, kernels/csrc/packed.cu): the forward one
program per block of boxes, the backward `conditional`'s walk of each image's slots.

Nothing is padded, so the targets cost N * 12 bytes to collate and copy whatever the
capacity M, and the loss reads only the valid boxes; the backward still writes the dense
[B, M, 4] gradient (zero where no box is). N changes with every batch: the kernels take it
as a runtime argument (one compiled kernel for every N), the allocator sees a new small
size each step (its cached blocks absorb it), and a CUDA graph, which freezes shapes,
cannot replay the step (training/speedups.py refuses it)."""

from functools import partial

from data import collate_packed
from kernels import bind_packed_loss
from losses.strategy import Strategy, tensors_to_device


def make(capacity: int, backend: str) -> Strategy:
    giou = bind_packed_loss(backend)

    def packed_loss(pred, targets):
        return giou(pred, *targets)

    return Strategy("packed", partial(collate_packed, capacity=capacity), tensors_to_device,
                    packed_loss, needs_cuda=backend == "cuda")
