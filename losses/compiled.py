"""compiled: the padded strategy's loss under torch.compile (Inductor writes the kernels).

The question it answers: does Inductor's generated code get where the hand-written fused
kernels are? Compilation happens on the first call (the profiler's wait step in train.py).
"""

from functools import partial

import torch

from data import collate_padded
from losses.padded import padded_loss
from losses.strategy import Strategy, padded_to_device


def make(capacity: int, kernel: str) -> Strategy:
    compiled = torch.compile(padded_loss, fullgraph=True)
    return Strategy("compiled", partial(collate_padded, capacity=capacity), padded_to_device,
                    compiled)
