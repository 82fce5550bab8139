"""padded: targets padded to the model's capacity; every slot computed, then masked."""

from functools import partial

import torch

from core.checks import check_padded
from data import collate_padded
from losses.giou import giou_loss_terms
from losses.strategy import Strategy, tensors_to_device


def padded_loss(pred, targets):
    boxes, counts = targets
    check_padded(pred, boxes, counts)
    return masked_giou_loss(pred, boxes, counts)


def masked_giou_loss(pred, boxes, counts):
    """Mean of 1 - GIoU over the slots below each count, with core/giou_rules.py's
    contract for bad values; every step stays on the device (no sync)."""
    slots = torch.arange(pred.shape[1], device=pred.device)
    # A count outside [0, M] cannot be seen on the host without a sync: such a sample
    # keeps every slot and has its predictions multiplied by NaN, so the loss and each of
    # its gradients are NaN, as in the fused kernels.
    bad = counts.clamp(0, pred.shape[1]) != counts
    keep = (slots < counts[:, None]) | bad[:, None]
    nan_if_bad = torch.where(bad, float("nan"), 1.0)[:, None, None]
    # Padding slots become zero boxes by selection before any maths, not by a zero factor
    # after: a NaN or inf left there would reach the gradient as 0 * NaN = NaN.
    safe_pred = torch.where(keep[..., None], pred, 0) * nan_if_bad
    terms = torch.where(keep, giou_loss_terms(safe_pred, boxes), 0.0)
    return terms.sum() / counts.sum().clamp(min=1)


def make(capacity: int, backend: str) -> Strategy:
    return Strategy("padded", partial(collate_padded, capacity=capacity), tensors_to_device,
                    padded_loss)
