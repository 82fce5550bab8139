"""What every GIoU implementation (losses/giou.py, both kernel backends) agrees on.

    I     = max(min(px2, gx2) - max(px1, gx1), 0) * max(min(py2, gy2) - max(py1, gy1), 0)
    U     = area(p) + area(g) - I
    C     = (max(px2, gx2) - min(px1, gx1)) * (max(py2, gy2) - min(py1, gy1))
    GIoU  = I / (U + eps) - (C - U) / (C + eps)                  eps = 1e-7
    term  = 1 - GIoU;  loss = sum of the valid slots' terms / max(valid slots, 1)

The contract for values outside the rules, the same in every strategy
(tests/core/test_giou_rules.py):
- a count outside [0, M] (padded layouts only: counts cannot be range-checked on the host
  without a sync) makes the loss NaN and every gradient of that sample NaN;
- a slot past its sample's count never matters: NaN or inf there leaves the loss and
  every gradient as they would be, and its own gradient is exactly 0;
- in the packed layouts (packed, nested), a box whose image or slot lies outside the
  predictions, or offsets that do not partition the N boxes into counts within [0, M],
  make the loss NaN and every box's gradient NaN (the packed kernel's backward also
  writes NaN over every row of an image whose offsets are bad); rows no box names keep
  a gradient of exactly 0.
"""

import torch

EPS = 1e-7
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def compute_dtype(pred: torch.Tensor) -> torch.dtype:
    """fp32 for fp16/bf16/fp32 predictions, fp64 for fp64 (gradcheck)."""
    return torch.promote_types(pred.dtype, torch.float32)
