"""Input checks shared by every strategy and kernel: one clear error per mistake.

They read only shapes, dtypes and devices (host metadata), so they cost no sync and work
on the fake tensors torch.compile traces with. They raise core.errors.InputError, also a
ValueError: the command line prints it as one line, a library caller catches it as such.
"""

import torch

from core.errors import InputError
from core.giou_rules import FLOAT_DTYPES


def _check_target_dtype(dtype: torch.dtype, what: str) -> None:
    if dtype == torch.bool or dtype.is_complex:
        raise InputError(f"{what} must be an integer or float tensor, got {dtype}")


def check_pred(pred: torch.Tensor, batch: int | None = None) -> None:
    if not isinstance(pred, torch.Tensor) or pred.dim() != 3 or pred.shape[-1] != 4:
        shape = tuple(pred.shape) if isinstance(pred, torch.Tensor) else type(pred).__name__
        raise InputError(f"predictions must be a [batch, slots, 4] tensor, got {shape}")
    if pred.dtype not in FLOAT_DTYPES:
        raise InputError(f"predictions must be fp16, bf16, fp32 or fp64, got {pred.dtype}")
    if batch is not None and pred.shape[0] != batch:
        raise InputError(f"predictions hold {pred.shape[0]} samples but the targets "
                         f"hold {batch}")


def check_padded(pred: torch.Tensor, boxes: torch.Tensor, counts: torch.Tensor) -> None:
    """Padded targets [B, M, 4] with per-sample counts [B] beside predictions [B, M, 4]."""
    check_pred(pred)
    if boxes.shape != pred.shape:
        raise InputError(f"padded targets {tuple(boxes.shape)} must have the predictions' "
                         f"shape {tuple(pred.shape)}")
    _check_target_dtype(boxes.dtype, "targets")
    if counts.dim() != 1 or counts.shape[0] != pred.shape[0]:
        raise InputError(f"counts must be a [{pred.shape[0]}] tensor (one per sample), "
                         f"got {tuple(counts.shape)}")
    if counts.dtype not in (torch.int32, torch.int64):
        raise InputError(f"counts must be int32 or int64, got {counts.dtype}")
    if not pred.device == boxes.device == counts.device:
        raise InputError(f"predictions, targets and counts must be on one device, got "
                         f"{pred.device}, {boxes.device} and {counts.device}")


def check_packed(pred: torch.Tensor, boxes: torch.Tensor, index: torch.Tensor,
                 offsets: torch.Tensor) -> None:
    """Packed targets: boxes [N, 4], index [2, N] (each box's image, then its slot) and
    offsets [B + 1] (image b's boxes are rows offsets[b] .. offsets[b + 1] - 1) beside
    predictions [B, M, 4]. Whether the values are in range needs a sync: the kernels and
    the nested strategy check those on the device."""
    check_pred(pred)
    if not isinstance(boxes, torch.Tensor) or boxes.dim() != 2 or boxes.shape[-1] != 4:
        shape = tuple(boxes.shape) if isinstance(boxes, torch.Tensor) else type(boxes).__name__
        raise InputError(f"packed targets must be a [boxes, 4] tensor, got {shape}")
    _check_target_dtype(boxes.dtype, "targets")
    if index.dim() != 2 or tuple(index.shape) != (2, boxes.shape[0]):
        raise InputError(f"the packed index must be [2, {boxes.shape[0]}] (each box's image "
                         f"and slot), got {tuple(index.shape)}")
    if offsets.dim() != 1 or offsets.shape[0] != pred.shape[0] + 1:
        raise InputError(f"offsets must be a [{pred.shape[0] + 1}] tensor (batch + 1), got "
                         f"{tuple(offsets.shape)}")
    for name, t in (("the packed index", index), ("offsets", offsets)):
        if t.dtype not in (torch.int32, torch.int64):
            raise InputError(f"{name} must be int32 or int64, got {t.dtype}")
    if not pred.device == boxes.device == index.device == offsets.device:
        raise InputError(f"predictions, targets, index and offsets must be on one device, "
                         f"got {pred.device}, {boxes.device}, {index.device} and "
                         f"{offsets.device}")


def check_list(pred: torch.Tensor, targets) -> None:
    """A list of per-sample [n_i, 4] targets beside predictions [B, M, 4]."""
    check_pred(pred, batch=len(targets))
    for i, t in enumerate(targets):
        if t.dim() != 2 or t.shape[-1] != 4:
            raise InputError(f"target {i} must be [n, 4], got {tuple(t.shape)}")
        _check_target_dtype(t.dtype, f"target {i}")
        if t.shape[0] > pred.shape[1]:
            raise InputError(f"target {i} has {t.shape[0]} boxes but the model predicts "
                             f"only {pred.shape[1]}")
        if t.device != pred.device:
            raise InputError(f"target {i} is on {t.device}, predictions on {pred.device}")


def check_conv_block(name: str, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                     c_in: int, c_out: int) -> None:
    """A Triton conv 3x3 -> 2x2 max-pool -> ReLU block's inputs beyond x's dtype (kernels/
    trunk/first_block.py, second_block.py): poolable sizes, the conv's weight and
    bias, fp32 (fp64 for gradcheck) parameters, one device."""
    if x.shape[2] % 2 or x.shape[3] % 2:
        raise InputError(f"{name} pools 2x2: H and W must be even, got {tuple(x.shape[2:])}")
    if tuple(weight.shape) != (c_out, c_in, 3, 3) or tuple(bias.shape) != (c_out,):
        raise InputError(f"{name} is Conv2d({c_in}, {c_out}, 3): weight "
                         f"{tuple(weight.shape)}, bias {tuple(bias.shape)}")
    if weight.dtype not in (torch.float32, torch.float64) or bias.dtype != weight.dtype:
        raise InputError(f"{name} takes fp32 (or fp64) weight and bias of one dtype, got "
                         f"{weight.dtype} and {bias.dtype}")
    if not (x.device == weight.device == bias.device):
        raise InputError(f"{name}'s tensors must be on one device")
