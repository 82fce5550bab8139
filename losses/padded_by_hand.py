"""padded's loss with its gradient written out by hand in PyTorch ops, for
`--padded-backward-by-hand` (training/speedups/padded_backward_by_hand.py).

Why: padded's loss is ~35 small kernels forward over the [B, M] slots and autograd's
backward of it ~65 more (61 ATen ops, each slice's backward a fill and a copy). Every one
touches at most 1–4 MB at the GPU preset (1024 × 256 slots), a microsecond or two of work,
so the loss's time is its kernel count: ~0.25 ms of GPU time a step even replayed as one
CUDA graph (results/step.md). Written out, the backward is ~25 kernels: the chain through
GIoU's quotients is 10 ops on [B, M] (autograd spends ~25 on it, a negation here, a
multiply by one there); the three products' derivatives are one multiply over the
extents stacked [B, M, 5, 2], and the max/min corners' are two addcmuls.

The forward is padded's (losses/padded.py, losses/giou.py) op for op: the same loss bit for
bit. The gradient is the same maths in another order of rounding (within ~1e-7 of
autograd's in fp32), with autograd's conventions: a max or min whose arguments tie sends
half the gradient to each; clamp(min=0) passes the gradient at exactly 0; a sample whose
count lies outside [0, M] gets NaN everywhere; a slot past its count gets exactly 0
(core/giou_rules.py).
"""

import torch
from torch.autograd.function import once_differentiable

from core.checks import check_padded
from core.giou_rules import EPS, compute_dtype


def padded_loss_by_hand(pred, targets):
    """padded_loss(pred, (boxes, counts)) with the backward below: one autograd node."""
    boxes, counts = targets
    check_padded(pred, boxes, counts)
    return _PaddedGIoU.apply(pred, boxes, counts)


class _PaddedGIoU(torch.autograd.Function):
    @staticmethod
    def forward(ctx, pred, boxes, counts):
        # masked_giou_loss and giou_loss_terms in the same order (see their comments).
        slots = torch.arange(pred.shape[1], device=pred.device)
        bad = counts.clamp(0, pred.shape[1]) != counts
        keep = (slots < counts[:, None]) | bad[:, None]
        nan_if_bad = torch.where(bad, float("nan"), 1.0)[:, None, None]
        safe = torch.where(keep[..., None], pred, 0) * nan_if_bad
        dt = compute_dtype(pred)
        p, g = safe.to(dt), boxes.to(dt)
        hi, lo = torch.maximum(p, g), torch.minimum(p, g)
        inter_raw = lo[..., 2:] - hi[..., :2]
        inter_wh = inter_raw.clamp(min=0)
        hull_wh = hi[..., 2:] - lo[..., :2]
        pred_wh, target_wh = p[..., 2:] - p[..., :2], g[..., 2:] - g[..., :2]
        inter = inter_wh[..., 0] * inter_wh[..., 1]
        union = pred_wh[..., 0] * pred_wh[..., 1] + target_wh[..., 0] * target_wh[..., 1] \
            - inter
        hull = hull_wh[..., 0] * hull_wh[..., 1]
        a, c = union + EPS, hull + EPS
        inter_a, rest_c = inter / a, (hull - union) / c
        terms = torch.where(keep, 1 - (inter_a - rest_c), 0.0)
        n = counts.sum().clamp(min=1)
        ctx.save_for_backward(keep, nan_if_bad, n, p, g, inter_raw, inter_wh, hull_wh,
                              pred_wh, a, c, inter_a, rest_c)
        ctx.pred_dtype = pred.dtype
        return terms.sum() / n

    @staticmethod
    @once_differentiable
    def backward(ctx, grad_loss):
        (keep, nan_if_bad, n, p, g, inter_raw, inter_wh, hull_wh, pred_wh, a, c, inter_a,
         rest_c) = ctx.saved_tensors
        # d loss / d term, as autograd: the mean's division, then the mask's selection.
        v = torch.where(keep, grad_loss / n, 0.0)
        # term = 1 - inter/a + (hull - union)/c, a = union + eps, c = hull + eps,
        # union = area(p) + area(g) - inter. With ra = v/a and rc = v/c:
        #   d union = ra * inter/a - rc,  d hull = rc - rc * (hull - union)/c,
        #   d inter = -ra - d union (kept negated: the corners' signs below absorb it).
        ra, rc = v / a, v / c
        d_union = ra * inter_a - rc
        d_hull = rc - rc * rest_c
        neg_d_inter = ra + d_union
        # Each area's derivative by one extent is the other extent: five rows of (x, y)
        # pairs, d extent = d area * the extent's partner, in one multiply. Rows:
        # -d inter_wh, d hull_wh, -d inter_wh, -d pred_wh, d pred_wh.
        scale = torch.stack((neg_d_inter, d_hull, neg_d_inter, -d_union, d_union), -1)
        partner = torch.stack(
            (inter_wh[..., 1], inter_wh[..., 0], hull_wh[..., 1], hull_wh[..., 0],
             inter_wh[..., 1], inter_wh[..., 0], pred_wh[..., 1], pred_wh[..., 0],
             pred_wh[..., 1], pred_wh[..., 0]), -1).unflatten(-1, (5, 2))
        d = scale[..., None] * partner
        # clamp(min=0)'s backward: nothing through an axis whose overlap was negative.
        cut = inter_raw < 0
        d[..., 0, :].masked_fill_(cut, 0)
        d[..., 2, :].masked_fill_(cut, 0)
        # The corners: hi = max(p, g) = (hi1, hi2) takes -d inter_wh and d hull_wh (rows 0,
        # 1); lo = min(p, g) = (lo1, lo2) takes -d hull_wh and d inter_wh, rows 1, 2
        # negated; p itself takes -d pred_wh and d pred_wh (rows 3, 4). A tie of p and g
        # sends half to each, as autograd's maximum and minimum do.
        b, m = p.shape[:2]
        to_hi = torch.where(p == g, 0.5, p > g)
        d_p = torch.addcmul(d[..., 3:, :].reshape(b, m, 4), d[..., :2, :].reshape(b, m, 4),
                            to_hi)
        d_p = torch.addcmul(d_p, d[..., 1:3, :].reshape(b, m, 4), to_hi - 1)
        # The mask's backward (padding slots exactly 0) and the bad count's NaN.
        d_pred = torch.where(keep[..., None], d_p * nan_if_bad, 0)
        return d_pred.to(ctx.pred_dtype), None, None
