"""compiled: the padded strategy's loss under torch.compile (Inductor writes the kernels).

The question it answers: does Inductor's generated code get where the hand-written fused
kernels are? Compilation happens on the first call (the profiler's wait step in train.py).
The input checks run before the compiled region, in Python, so a bad input is the same
one-line error as padded's rather than a Dynamo trace of the raise.
"""

from functools import partial

import torch

from core.checks import check_padded
from data import collate_padded
from losses.padded import masked_giou_loss
from losses.strategy import Strategy, tensors_to_device


def make(capacity: int, backend: str) -> Strategy:
    compiled = torch.compile(masked_giou_loss, fullgraph=True)

    def compiled_loss(pred, targets):
        boxes, counts = targets
        check_padded(pred, boxes, counts)
        return compiled(pred, boxes, counts)

    return Strategy("compiled", partial(collate_padded, capacity=capacity), tensors_to_device,
                    compiled_loss)
