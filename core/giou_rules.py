"""What every GIoU implementation (losses/giou.py, both kernel backends) agrees on: the
formula, its eps, and the contract for values outside the rules (bad counts poison their
sample, slots past a count never matter). The design in full: docs/design.md, this
module's section."""

import torch

EPS = 1e-7
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


def compute_dtype(pred: torch.Tensor) -> torch.dtype:
    """fp32 for fp16/bf16/fp32 predictions, fp64 for fp64 (gradcheck)."""
    return torch.promote_types(pred.dtype, torch.float32)
