"""The GIoU loss maths in PyTorch ops (used by loop, concat, padded and compiled); the
formula, eps and dtype rules are core/giou_rules.py's, which the kernels follow too.

Gradient conventions at non-differentiable points are PyTorch autograd's: a max/min whose
arguments tie sends half the gradient to each, and clamp(min=0) passes the gradient at
exactly zero. The fused kernels implement the same conventions, so they agree with this
module (and the float64 reference) on identical, touching and degenerate boxes.
"""

import torch

from core.giou_rules import EPS, compute_dtype


def giou_loss_terms(pred: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Per-box 1 - GIoU for boxes [..., 4]; computed in fp32 (fp64 for fp64 input).

    One maximum and one minimum of the two boxes' 4-vectors give both the intersection's
    corners (max of the top-lefts, min of the bottom-rights) and the hull's (min of the
    top-lefts, max of the bottom-rights), and each extent is taken in (x, y) pairs: 38
    ATen ops forward and 61 backward in padded's loss against 49 and 92 for the eight
    coordinates one by one. Every element's arithmetic is in the same order, so the terms
    are bitwise those of giou_terms_of, and the gradient too except where a coordinate
    ties its target's: autograd sums that coordinate's paths in another order
    (tests/losses)."""
    dt = compute_dtype(pred)
    p, g = pred.to(dt), target.to(dt)
    hi, lo = torch.maximum(p, g), torch.minimum(p, g)
    inter_wh = (lo[..., 2:] - hi[..., :2]).clamp(min=0)
    hull_wh = hi[..., 2:] - lo[..., :2]
    pred_wh, target_wh = p[..., 2:] - p[..., :2], g[..., 2:] - g[..., :2]
    return _terms(*inter_wh.unbind(-1), *hull_wh.unbind(-1), *pred_wh.unbind(-1),
                  *target_wh.unbind(-1))


def giou_terms_of(px1, py1, px2, py2, gx1, gy1, gx2, gy2, minimum=torch.minimum,
                  maximum=torch.maximum):
    """1 - GIoU from the eight coordinates, each a tensor of one shape: for layouts whose
    coordinates are apart (compiled_packed's columns, nested's jagged tensors). `minimum`
    and `maximum` are parameters for the nested strategy, whose jagged tensors have no
    backward for torch.minimum and torch.maximum (losses/nested.py)."""
    inter_w = (minimum(px2, gx2) - maximum(px1, gx1)).clamp(min=0)
    inter_h = (minimum(py2, gy2) - maximum(py1, gy1)).clamp(min=0)
    hull_w, hull_h = maximum(px2, gx2) - minimum(px1, gx1), maximum(py2, gy2) - minimum(py1, gy1)
    return _terms(inter_w, inter_h, hull_w, hull_h, px2 - px1, py2 - py1, gx2 - gx1, gy2 - gy1)


def _terms(inter_w, inter_h, hull_w, hull_h, pred_w, pred_h, target_w, target_h):
    """1 - GIoU from the intersection's, the hull's and the two boxes' extents."""
    inter = inter_w * inter_h
    union = pred_w * pred_h + target_w * target_h - inter
    hull = hull_w * hull_h
    giou = inter / (union + EPS) - (hull - union) / (hull + EPS)
    return 1 - giou


def no_boxes_loss(pred: torch.Tensor) -> torch.Tensor:
    """A zero loss still attached to pred (a zero gradient): the GIoU terms of no box.
    Any B and M, 0 included."""
    none = pred.reshape(-1, 4)[:0]
    return giou_loss_terms(none, none).sum()
