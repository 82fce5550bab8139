"""compiled_packed: Inductor over the packed layout, the case study's own question: can the
compiler follow targets whose shape changes every batch? One compiled function a process,
dynamic shapes, torch.sym_max: one graph for every N but 0 and 1.
Its design in full: docs/design.md."""

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
