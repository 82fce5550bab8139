"""lin1's three GEMMs in float8 (--float8-lin1): torch._scaled_mm with one scale per
tensor (torchao's tensorwise recipe), the weight cast once a step after the update. It
changes the maths. Its design in full: docs/kernels.md."""

import torch

from core.errors import InputError

E4M3 = torch.float8_e4m3fn
E5M2 = torch.float8_e5m2


def quantized(t: torch.Tensor, dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """(t scaled to dtype's range and cast, the inverse scale): one scale for the tensor,
    from its amax on the device (no sync). An all-zero tensor keeps a finite scale."""
    top = torch.finfo(dtype).max
    amax = t.detach().abs().amax().float().clamp(min=1e-12)
    scale = top / amax
    return (t.float() * scale).clamp(-top, top).to(dtype), scale.reciprocal()


def _check(x: torch.Tensor, w8: torch.Tensor) -> None:
    if x.dim() != 2 or any(n % 16 for n in (*x.shape, w8.shape[0])):
        raise InputError(f"float8 GEMMs take sizes that are multiples of 16: batch "
                         f"{x.shape[0]}, features {x.shape[-1]}, hidden {w8.shape[0]}")


class Float8Linear(torch.autograd.Function):
    """y = x @ W.T + b with W's float8 copies (w8, w8t) and their inverse scale (a
    0-dim fp32 tensor): the gradient of `weight`, the bf16 parameter the copies were cast
    from, is dw (bf16); the copies and scale get none."""

    @staticmethod
    def forward(ctx, x, weight, bias, w8, w8t, w_inverse):
        _check(x, w8)
        x8, x_inverse = quantized(x, E4M3)
        y = torch._scaled_mm(x8, w8.t(), scale_a=x_inverse, scale_b=w_inverse,
                             out_dtype=torch.bfloat16, use_fast_accum=True)
        ctx.save_for_backward(x8.t().contiguous(), x_inverse, w8t, w_inverse)
        ctx.dtypes = (x.dtype, weight.dtype, None if bias is None else bias.dtype)
        return y if bias is None else y + bias.to(y.dtype)

    @staticmethod
    def backward(ctx, dy):
        x8t, x_inverse, w8t, w_inverse = ctx.saved_tensors
        x_dtype, w_dtype, b_dtype = ctx.dtypes
        dy8, dy_inverse = quantized(dy, E5M2)
        dx = torch._scaled_mm(dy8, w8t.t(), scale_a=dy_inverse, scale_b=w_inverse,
                              out_dtype=torch.bfloat16)
        dw = torch._scaled_mm(dy8.t().contiguous(), x8t.t(), scale_a=dy_inverse,
                              scale_b=x_inverse, out_dtype=torch.bfloat16)
        db = None if b_dtype is None else dy.float().sum(0).to(b_dtype)
        return dx.to(x_dtype), dw.to(w_dtype), db, None, None, None


def float8_linear(x, weight, bias, w8, w8t, w_inverse):
    return Float8Linear.apply(x, weight, bias, w8, w8t, w_inverse)
