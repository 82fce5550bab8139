"""packed: every valid box of the batch in one [N, 4] tensor with each box's image and slot
(the layout ultralytics' YOLO trainers collate) and per-image offsets, and fused kernels
(Triton or CUDA: kernels/giou/triton_packed.py, kernels/giou/csrc/packed.cu): the forward
one program per block of boxes, the backward `conditional`'s walk of each image's slots.

Why: nothing is padded, so the targets cost N * 12 + 8(B + 1) bytes whatever the capacity
M. N changes every batch: Triton compiles each kernel once (N a runtime argument), and no
CUDA graph can replay the step. What that costs, and the bucketed capacity not built:
docs/design.md, this module's section."""

from functools import partial

from data import collate_packed
from kernels.giou import bind_packed_loss
from losses.strategy import Strategy, tensors_to_device


def make(capacity: int, backend: str) -> Strategy:
    giou = bind_packed_loss(backend)

    def packed_loss(pred, targets):
        return giou(pred, *targets)

    return Strategy("packed", partial(collate_packed, capacity=capacity), tensors_to_device,
                    packed_loss, needs_cuda=backend == "cuda")
