"""The GIoU loss maths, written once in PyTorch ops (used by loop, concat and padded).

For a predicted box p and a target box g, both (x1, y1, x2, y2):
    I     = max(min(px2, gx2) - max(px1, gx1), 0) * max(min(py2, gy2) - max(py1, gy1), 0)
    U     = area(p) + area(g) - I
    C     = (max(px2, gx2) - min(px1, gx1)) * (max(py2, gy2) - min(py1, gy1))
    GIoU  = I / (U + eps) - (C - U) / (C + eps)                  eps = 1e-7
    term  = 1 - GIoU
torchvision's generalized_box_iou_loss semantics, with the intersection's extents
clamped at zero (the original's kernel did not clamp, so two disjoint boxes had a positive
"intersection"), and 1 - GIoU rather than GIoU (the original minimised the wrong sign).

Gradient conventions at non-differentiable points are PyTorch autograd's: a
max/min whose arguments tie sends half the gradient to each, and clamp(min=0) passes the
gradient at exactly zero. The fused kernels implement the same conventions, so they agree
with this module (and the float64 reference) on identical, touching and degenerate boxes.
"""

import torch

EPS = 1e-7


def compute_dtype(pred: torch.Tensor) -> torch.dtype:
    """fp32 for fp16/bf16/fp32 predictions, fp64 for fp64 (gradcheck)."""
    return torch.promote_types(pred.dtype, torch.float32)


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
