"""nested: the packed targets as PyTorch's jagged tensors (torch.nested, layout=torch.jagged:
values plus offsets), and the GIoU maths in torch ops on them.

Each box's prediction is gathered by its (image, slot) from the collate's index (one
index_select: the only gather, no padding copied), and the eight coordinates become
jagged tensors [B, j] on the collate's offsets, so every term is a tensor of the batch's
ragged shape. The loss is the sum of the terms over every box / max(N, 1).

What torch.nested does and does not do for this loss (torch 2.13 on the CPU and 2.11 on
the H100, the same on both unless said; results/strategies.md):
- torch.nested.narrow(pred, 1, 0, counts, layout=torch.jagged) views the padded
  predictions without a copy, but nothing useful follows: an elementwise op with the
  targets' jagged tensor is refused (their ragged dims are different nested ints);
  .contiguous() then fails in the backward (CloneBackward0 returns the wrong ragged
  shape), and .sum() of the view sums the padding too (its gradient is 1 in every slot).
  So the predictions are gathered, not narrowed.
- backward is missing for unbind(-1), select (x[..., i]) and narrow on the last dim, and
  for torch.minimum / torch.maximum (aten.masked_fill_ has no jagged kernel). The
  coordinates are therefore split before they are wrapped, and min / max are taken
  by torch.minimum / torch.maximum on the jagged tensors' values (dense, one ragged
  structure), wrapped again on the same offsets: exact, with PyTorch's tie rule.
  Two other ways were tried and are wrong or slow. (a + b -/+ |a - b|) / 2 rounds
  a + b in fp32, so a touching intersection (exactly 0) came out about -1e-5 and
  clamp(min=0) cut the gradient every other strategy passes: 1e-2 to 1e-1 of the
  gradient lost with fp32 predictions off the integer grid (bf16 inputs sum exactly in
  fp32, so bf16 passed). torch.where has a jagged backward but its broadcast is Python,
  about twice the host time of this form. The values' minimum costs the host about
  what the abs form did.
- clamp, abs, where, arithmetic, .to(dtype) and .values() have jagged kernels and backward.
- The jagged structure itself is never used by this loss (a mean over all boxes): the
  ops run on the values, each through a Python __torch_dispatch__ on the host, so a call
  is host-bound (tens of ms at batch 1024).
- torch.compile: on torch 2.13 (CPU) the loss compiles with fullgraph and dynamic
  shapes, one graph for every N; on torch 2.11 (the H100) Inductor refuses it
  ("inductor does not support layout=torch.jagged"), with or without fullgraph. The
  strategy therefore runs eager everywhere: the same code on both versions.
  The probe that found each line of this list is in the archive (results/archive.md).

Bad values (core/giou_rules.py), checked on the device as the packed kernels check them:
an image or slot out of range (never read: the gather reads row 0 and drops it), or
offsets that do not partition the N boxes into counts within [0, M], make the loss and
every box's gradient NaN; a slot no box names is never read, so its gradient is exactly
0 whatever it holds.
"""

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
