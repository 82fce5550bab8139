"""packed: every valid box of the batch in one [N, 4] tensor with each box's image and slot
(the layout ultralytics' YOLO trainers collate) and per-image offsets, and fused kernels
(Triton or CUDA: kernels/giou/triton_packed.py, kernels/giou/csrc/packed.cu): the forward one
program per block of boxes, the backward `conditional`'s walk of each image's slots.

Nothing is padded, so the targets cost N * 12 + 8(B + 1) bytes to collate and copy
whatever the capacity M, and the forward reads only the valid boxes; the backward still
writes the dense [B, M, 4] gradient (zero where no box is), as conditional's does.

N changes with every batch. What that costs:
- Triton compiles each kernel once: N is a runtime argument, kept out of Triton's
  specialisation (on being 1 or a multiple of 16), whose second variant was compiled in
  the middle of an epoch (kernels/giou/triton_packed.py). torch.compile with dynamic shapes runs
  it over batches of different N with the eager values (tests/losses/test_packed.py); how many
  compiles that takes was not counted.
- The allocator sees a new small size each step (the targets, the forward's partials);
  its cached blocks absorb those (a few KB), unlike the padded layout's 1-17 MB.
- A CUDA graph freezes shapes, so it cannot replay the step: training/speedups/
  cuda_graph.py refuses it. A bucketed capacity would let it: N rounded up to a fixed
  bucket, the spare rows given a marker the kernels skip (an out-of-range image is an
  error today) and the denominator read from offsets[B] on the device instead of from
  the shape, at the cost of a maximum N no batch may pass. Not built: the step already
  runs at the GPU's rate without a graph (results/host.md)."""

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
