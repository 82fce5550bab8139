"""compiled_packed: Inductor over the packed layout, the case study's own question: can the
compiler follow targets whose shape changes every batch?

The targets are packed's (every valid box in one [N, 4] tensor, each box's image and slot,
per-image offsets: nothing padded, N new each batch), the maths nested's in plain tensors:
each box's prediction gathered by its (image, slot) (losses/nested.gather_predictions:
one index_select, NaN on bad places or offsets, no sync), the GIoU terms over [N], their
sum over max(N, 1). torch.compile with dynamic shapes and fullgraph: N is a symbol, not a
constant, so one graph serves every N. Two things would specialise it, and both are kept
out: max(N, 1) in Python guards on N (torch.sym_max does not), and one compiled function
for the process (the strategy is made for every run of make compare; a function compiled
anew would be traced anew). Dynamo still specialises a size of 0 or 1 (its rule for every
dynamic size): a batch with no box, or one, compiles a graph of its own, once.

How many graphs an epoch costs, and the loss's time beside the fused kernels:
results/mfu.md; tests/losses/test_compiled_packed.py counts them over 50 batches of
different N, on the CPU and on the GPU.
"""

from functools import partial

import torch

from core.checks import check_packed
from core.giou_rules import compute_dtype
from data import collate_packed
from losses.giou import giou_terms_of
from losses.nested import gather_predictions
from losses.strategy import Strategy, tensors_to_device


def packed_giou_loss(pred, boxes, index, offsets):
    """Mean of 1 - GIoU over the N boxes, each against its (image, slot)'s prediction."""
    picked, poison = gather_predictions(pred, index, offsets)
    dt = compute_dtype(pred)
    p = picked.to(dt) * poison.to(dt)
    g = boxes.to(dt)
    terms = giou_terms_of(p[:, 0], p[:, 1], p[:, 2], p[:, 3], g[:, 0], g[:, 1], g[:, 2],
                          g[:, 3])
    n = boxes.shape[0]
    # torch.sym_max keeps N unguarded (max() would guard N > 1: a graph each side). A size
    # Dynamo specialised (0 or 1) is a plain int, and torch 2.11's Dynamo traces no torch.*
    # call that returns one under fullgraph ("torch.* op returned non-Tensor").
    return terms.sum() / (torch.sym_max(n, 1) if isinstance(n, torch.SymInt) else max(n, 1))


_compiled = {}


def compiled_loss():
    """The process's one compiled loss (the module's docstring says why one)."""
    if "loss" not in _compiled:
        _compiled["loss"] = torch.compile(packed_giou_loss, dynamic=True, fullgraph=True)
    return _compiled["loss"]


def make(capacity: int, backend: str) -> Strategy:
    compiled = compiled_loss()

    def loss(pred, targets):
        boxes, index, offsets = targets
        check_packed(pred, boxes, index, offsets)
        return compiled(pred, boxes, index, offsets)

    return Strategy("compiled_packed", partial(collate_packed, capacity=capacity),
                    tensors_to_device, loss)
