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
    """Per-box 1 - GIoU for boxes [..., 4]; computed in fp32 (fp64 for fp64 input)."""
    dt = compute_dtype(pred)
    px1, py1, px2, py2 = pred.to(dt).unbind(-1)
    gx1, gy1, gx2, gy2 = target.to(dt).unbind(-1)
    inter_w = (torch.minimum(px2, gx2) - torch.maximum(px1, gx1)).clamp(min=0)
    inter_h = (torch.minimum(py2, gy2) - torch.maximum(py1, gy1)).clamp(min=0)
    inter = inter_w * inter_h
    union = (px2 - px1) * (py2 - py1) + (gx2 - gx1) * (gy2 - gy1) - inter
    hull = ((torch.maximum(px2, gx2) - torch.minimum(px1, gx1))
            * (torch.maximum(py2, gy2) - torch.minimum(py1, gy1)))
    giou = inter / (union + EPS) - (hull - union) / (hull + EPS)
    return 1 - giou


def no_boxes_loss(pred: torch.Tensor) -> torch.Tensor:
    """A zero loss still attached to pred (a zero gradient): the GIoU terms of no box.
    Any B and M, 0 included."""
    none = pred.reshape(-1, 4)[:0]
    return giou_loss_terms(none, none).sum()
