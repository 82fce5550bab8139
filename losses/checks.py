"""Input checks shared by every strategy and kernel: one clear error per mistake.

These read only shapes, dtypes and devices (host metadata), so they cost no sync and
work on the fake tensors that torch.compile traces with.
"""

import torch

from errors import UserError

_FLOAT = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def check_pred(pred: torch.Tensor, batch: int | None = None) -> None:
    if not isinstance(pred, torch.Tensor) or pred.dim() != 3 or pred.shape[-1] != 4:
        shape = tuple(pred.shape) if isinstance(pred, torch.Tensor) else type(pred).__name__
        raise UserError(f"predictions must be a [batch, slots, 4] tensor, got {shape}")
    if pred.dtype not in _FLOAT:
        raise UserError(f"predictions must be fp16, bf16, fp32 or fp64, got {pred.dtype}")
    if batch is not None and pred.shape[0] != batch:
        raise UserError(f"predictions hold {pred.shape[0]} samples but the targets "
                        f"hold {batch}")


def check_padded(pred: torch.Tensor, boxes: torch.Tensor, counts: torch.Tensor) -> None:
    """Padded targets [B, M, 4] with per-sample counts [B] beside predictions [B, M, 4]."""
    check_pred(pred)
    if boxes.shape != pred.shape:
        raise UserError(f"padded targets {tuple(boxes.shape)} must have the predictions' "
                        f"shape {tuple(pred.shape)}")
    if boxes.dtype == torch.bool or boxes.is_complex():
        raise UserError(f"targets must be an integer or float tensor, got {boxes.dtype}")
    if counts.dim() != 1 or counts.shape[0] != pred.shape[0]:
        raise UserError(f"counts must be a [{pred.shape[0]}] tensor (one per sample), "
                        f"got {tuple(counts.shape)}")
    if counts.dtype not in (torch.int32, torch.int64):
        raise UserError(f"counts must be int32 or int64, got {counts.dtype}")
    if not pred.device == boxes.device == counts.device:
        raise UserError(f"predictions, targets and counts must be on one device, got "
                        f"{pred.device}, {boxes.device} and {counts.device}")


def check_list(pred: torch.Tensor, targets) -> None:
    """A list of per-sample [n_i, 4] targets beside predictions [B, M, 4]."""
    check_pred(pred, batch=len(targets))
    for i, t in enumerate(targets):
        if t.dim() != 2 or t.shape[-1] != 4:
            raise UserError(f"target {i} must be [n, 4], got {tuple(t.shape)}")
        if t.shape[0] > pred.shape[1]:
            raise UserError(f"target {i} has {t.shape[0]} boxes but the model predicts "
                            f"only {pred.shape[1]}")
        if t.device != pred.device:
            raise UserError(f"target {i} is on {t.device}, predictions on {pred.device}")
