"""nested: the packed targets as PyTorch's jagged tensors (torch.nested, layout=torch.jagged:
values plus offsets), and the GIoU maths in torch ops on them.

Why it looks as it does: torch.nested has no backward for the ops a GIoU needs on the
last dim (unbind, select, minimum, maximum), so the coordinates are split before they
are wrapped and min and max are taken on the values; every op dispatches through Python,
so a call is host-bound. The design in full (what torch.nested does and does not do, the
bad values): docs/design.md, this module's section."""

from functools import partial

import torch

from core.checks import check_packed
from core.giou_rules import compute_dtype
from data import collate_packed
from losses.giou import giou_terms_of
from losses.strategy import Strategy, tensors_to_device


def _on_values(op, a, b):
    # a and b share one ragged structure (the collate's offsets), so their values line up
    # box for box; op's dense kernel and backward apply, and the result is wrapped again.
    return torch.nested.nested_tensor_from_jagged(op(a.values(), b.values()), a.offsets())


def _minimum(a, b):
    # Exact, with torch.minimum's tie rule (half the gradient to each side): jagged
    # tensors have no backward for it (the module's docstring), their values do.
    return _on_values(torch.minimum, a, b)


def _maximum(a, b):
    return _on_values(torch.maximum, a, b)


def gather_predictions(pred, index, offsets):
    """Each box's prediction [N, 4] by its (image, slot), and a factor that is NaN when a
    place is out of range or the offsets do not partition the N boxes into counts within
    [0, M] (else 1): no sync, no out-of-bounds read."""
    B, M, N = pred.shape[0], pred.shape[1], index.shape[1]
    image, slot = index.long().unbind(0)
    bad = (image < 0) | (image >= B) | (slot < 0) | (slot >= M)
    rows = torch.where(bad, 0, image * M + slot)
    # A bad box reads row 0 and drops it by selection, so no gradient flows back there.
    picked = torch.where(bad[:, None], 0, pred.reshape(-1, 4).index_select(0, rows))
    counts = offsets[1:] - offsets[:-1]
    ends = torch.stack([offsets[0], offsets[-1] - N])
    wrong = bad.any() | ((counts < 0) | (counts > M)).any() | (ends != 0).any()
    return picked, torch.where(wrong, float("nan"), 1.0)


def _quiet_fx_tracing_warning() -> None:
    """torch.nested's jagged ops ask torch.fx whether it is tracing, and torch logs 'is_fx_
    tracing will return true for both fx.symbolic_trace and torch.export' on the first
    call: a note for torch's own developers, printed into every nested run.
    Its logger alone is raised to errors."""
    import logging
    logging.getLogger("torch.fx._symbolic_trace").setLevel(logging.ERROR)


def nested_loss(pred, targets):
    boxes, index, offsets = targets
    check_packed(pred, boxes, index, offsets)
    picked, poison = gather_predictions(pred, index, offsets)
    dt = compute_dtype(pred)
    p = picked.to(dt) * poison.to(dt)
    g = boxes.to(dt)

    def jagged(column):
        return torch.nested.nested_tensor_from_jagged(column.contiguous(), offsets)

    coords = [jagged(p[:, i]) for i in range(4)] + [jagged(g[:, i]) for i in range(4)]
    terms = giou_terms_of(*coords, minimum=_minimum, maximum=_maximum)
    return terms.values().sum() / max(boxes.shape[0], 1)


def make(capacity: int, backend: str) -> Strategy:
    _quiet_fx_tracing_warning()
    return Strategy("nested", partial(collate_packed, capacity=capacity), tensors_to_device,
                    nested_loss)
