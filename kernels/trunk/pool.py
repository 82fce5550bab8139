"""A conv block's bias, 2x2 max-pool and ReLU in Triton, around cuDNN's bias-free conv
(`--triton-pool`: BoxNet's third and fourth blocks).

Why: the bias add, pool, ReLU and their backward were separate passes over the 537 MB
full-resolution output (batch 1024); here the bias is added inside the pool and the
choice is one int8 code: ~0.74 GB each way.

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import triton
import triton.language as tl

from core.errors import InputError
from kernels.rounding import POOL_DTYPES, TL_DTYPE, round_to
from kernels.triton_op import INTERPRETED, define_op, empty_4d, is_nhwc, launch
from kernels.trunk.window import DEAD, flat_bij

# Pooled pixels x channels per program; the channels are x's contiguous dimension under
# channels_last, so each row of a window position is one coalesced load.
BLOCK_P, BLOCK_C, NUM_WARPS = 64, 64, 4

_GENERIC = ["n_pooled", "C", "H2", "W2", "sxb", "sxh", "sxw", "syb", "syh", "syw", "sgb",
            "sgh", "sgw"]


@triton.jit
def _coords(pid_p, pid_c, n_pooled, C, H2, W2, BLOCK_P: tl.constexpr,
            BLOCK_C: tl.constexpr):
    """A program's pooled pixels (b, i, j, flat index) and channels, and their mask."""
    p = pid_p * BLOCK_P + tl.arange(0, BLOCK_P)
    c = pid_c * BLOCK_C + tl.arange(0, BLOCK_C)
    mask = (p < n_pooled)[:, None] & (c < C)[None, :]
    b, i, j = flat_bij(p, H2, W2)
    return p, c, b, i, j, mask


@triton.jit
def _rounded_max_bf16(base, sxh, sxw, bias, mask):
    """(y before the ReLU, code) of each window in bf16, rounding once: the first position
    at or above the least fp32 that rounds to the rounded maximum (docs/kernels.md)."""
    v0 = tl.load(base, mask=mask, other=0).to(tl.float32) + bias[None, :]
    v1 = tl.load(base + sxw, mask=mask, other=0).to(tl.float32) + bias[None, :]
    v2 = tl.load(base + sxh, mask=mask, other=0).to(tl.float32) + bias[None, :]
    v3 = tl.load(base + sxh + sxw, mask=mask, other=0).to(tl.float32) + bias[None, :]
    m = tl.maximum(tl.maximum(v0, v1), tl.maximum(v2, v3))
    r = round_to(m, tl.bfloat16)
    rb = r.to(tl.int32, bitcast=True)
    lo = rb - 0x8000 + ((rb >> 16) & 1)
    code = tl.where(v2.to(tl.int32, bitcast=True) >= lo, 2, 3)
    code = tl.where(v1.to(tl.int32, bitcast=True) >= lo, 1, code)
    code = tl.where(v0.to(tl.int32, bitcast=True) >= lo, 0, code)
    r = tl.where(v0 != v0, v0, r)
    r = tl.where(v1 != v1, v1, r)
    r = tl.where(v2 != v2, v2, r)
    r = tl.where(v3 != v3, v3, r)
    return r, tl.where(r > 0.0, code, DEAD)


@triton.jit(do_not_specialize_on_alignment=_GENERIC)
def _pool_fwd_kernel(x_ptr, bias_ptr, y_ptr, code_ptr, n_pooled, C, H2, W2,
                     sxb, sxc, sxh, sxw, syb, syc, syh, syw,
                     BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr, ROUND: tl.constexpr):
    p, c, b, i, j, mask = _coords(tl.program_id(0), tl.program_id(1), n_pooled, C, H2, W2,
                                  BLOCK_P, BLOCK_C)
    bias = round_to(tl.load(bias_ptr + c, mask=c < C, other=0).to(tl.float32), ROUND)
    base = x_ptr + (b * sxb + (2 * i) * sxh + (2 * j) * sxw)[:, None] + c[None, :] * sxc
    if ROUND == tl.bfloat16:
        best, code = _rounded_max_bf16(base, sxh, sxw, bias, mask)
    else:
        best = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
        code = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.int32)
        for d in tl.static_range(4):
            x = tl.load(base + (d // 2) * sxh + (d % 2) * sxw, mask=mask, other=0)
            v = round_to(x.to(tl.float32) + bias[None, :], ROUND)
            if d == 0:
                best = v
            else:
                take = (v > best) | (v != v)
                best = tl.where(take, v, best)
                code = tl.where(take, d, code)
        code = tl.where(best > 0.0, code, DEAD)
    y = tl.maximum(best, 0.0)  # relu keeps a NaN (tl.maximum propagates it)
    y = tl.where(best != best, best, y)
    tl.store(y_ptr + (b * syb + i * syh + j * syw)[:, None] + c[None, :] * syc,
             y.to(y_ptr.dtype.element_ty), mask=mask)
    tl.store(code_ptr + p.to(tl.int64)[:, None] * C + c[None, :], code.to(tl.int8),
             mask=mask)


@triton.jit(do_not_specialize_on_alignment=_GENERIC)
def _pool_bwd_kernel(grad_ptr, code_ptr, dx_ptr, part_ptr, n_pooled, C, H2, W2,
                     sgb, sgc, sgh, sgw, sxb, sxc, sxh, sxw,
                     BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
    pid_p = tl.program_id(0)
    p, c, b, i, j, mask = _coords(pid_p, tl.program_id(1), n_pooled, C, H2, W2, BLOCK_P,
                                  BLOCK_C)
    code = tl.load(code_ptr + p.to(tl.int64)[:, None] * C + c[None, :], mask=mask,
                   other=DEAD).to(tl.int32)
    g = tl.load(grad_ptr + (b * sgb + i * sgh + j * sgw)[:, None] + c[None, :] * sgc,
                mask=mask, other=0)
    g = tl.where(code < DEAD, g, 0.0)
    base = dx_ptr + (b * sxb + (2 * i) * sxh + (2 * j) * sxw)[:, None] + c[None, :] * sxc
    for d in tl.static_range(4):
        tl.store(base + (d // 2) * sxh + (d % 2) * sxw,
                 tl.where(code == d, g, 0.0).to(dx_ptr.dtype.element_ty), mask=mask)
    tl.store(part_ptr + pid_p.to(tl.int64) * C + c, tl.sum(g.to(tl.float32), axis=0),
             mask=c < C)


def _check(x: torch.Tensor, bias: torch.Tensor) -> None:
    if x.dim() != 4 or x.dtype not in POOL_DTYPES:
        raise InputError(f"pool_bias_relu takes a floating-point conv output [B, C, H, W], "
                         f"got {x.dtype} {tuple(x.shape)}")
    if x.shape[2] % 2 or x.shape[3] % 2:
        raise InputError(f"pool_bias_relu pools 2x2: H and W must be even, got "
                         f"{tuple(x.shape[2:])}")
    if tuple(bias.shape) != (x.shape[1],) or not bias.is_floating_point():
        raise InputError(f"pool_bias_relu's bias must be [{x.shape[1]}] floating point, got "
                         f"{bias.dtype} {tuple(bias.shape)}")
    if x.device != bias.device:
        raise InputError("pool_bias_relu's tensors must be on one device")


def _empty_out(x: torch.Tensor, flat: bool) -> torch.Tensor:
    """y [B, C, H/2, W/2] in x's dtype: contiguous where flat (the trunk's last block, whose
    flatten is then a view), else in x's memory format."""
    B, C, H, W = x.shape
    return empty_4d((B, C, H // 2, W // 2), x.dtype, x.device, not flat and is_nhwc(x))


def _empty_grad(grad: torch.Tensor, H: int, W: int, channels_last: bool) -> torch.Tensor:
    """dL/dx [B, C, H, W] in grad's dtype, in x's memory format."""
    return empty_4d((*grad.shape[:2], H, W), grad.dtype, grad.device, channels_last)


def _grid(n_pooled: int, C: int) -> tuple[int, int]:
    return triton.cdiv(n_pooled, BLOCK_P), triton.cdiv(C, BLOCK_C)


@define_op("boxnet::pool_bias_relu", mutates_args=())
def pool_bias_relu_op(x: torch.Tensor, bias: torch.Tensor,
                      flat: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(relu(maxpool2(x + bias)) [B, C, H/2, W/2], its int8 code [B*H/2*W/2, C]): one
    launch."""
    _check(x, bias)
    B, C, H, W = x.shape
    y = _empty_out(x, flat)
    n_pooled = B * (H // 2) * (W // 2)
    code = torch.empty((n_pooled, C), dtype=torch.int8, device=x.device)
    launch(_pool_fwd_kernel, _grid(n_pooled, C), x, bias, y, code, n_pooled, C, H // 2,
           W // 2, *x.stride(), *y.stride(), BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C,
           ROUND=TL_DTYPE[x.dtype], num_warps=NUM_WARPS)
    return y, code


@define_op("boxnet::pool_bias_relu_backward", mutates_args=())
def pool_bias_relu_backward(grad: torch.Tensor, code: torch.Tensor, H: int, W: int,
                            channels_last: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dx [B, C, H, W] in grad's dtype, channels_last as x was; dL/dbias [C] in fp32,
    not yet rounded): one launch and one reduction of the partial sums."""
    C = grad.shape[1]
    n_pooled = code.shape[0]
    dx = _empty_grad(grad, H, W, channels_last)
    grid = _grid(n_pooled, C)
    part = torch.empty((grid[0], C), dtype=torch.float32, device=grad.device)
    launch(_pool_bwd_kernel, grid, grad, code, dx, part, n_pooled, C, H // 2, W // 2,
           *grad.stride(), *dx.stride(), BLOCK_P=BLOCK_P, BLOCK_C=BLOCK_C,
           num_warps=NUM_WARPS)
    return dx, part.sum(0)


def _setup_context(ctx, inputs, output):
    x, bias, _ = inputs
    ctx.save_for_backward(output[1])  # the code: x itself is not kept alive
    ctx.shape = (x.shape[2], x.shape[3])
    ctx.channels_last = is_nhwc(x)
    ctx.dtypes = (x.dtype, bias.dtype)


def _backward(ctx, grad_y, grad_code):
    (code,) = ctx.saved_tensors
    dx, dbias = pool_bias_relu_backward(grad_y, code, *ctx.shape, ctx.channels_last)
    x_dtype, bias_dtype = ctx.dtypes
    # The unfused graph's bias gradient is the cast's backward of a sum in x's dtype.
    return dx, dbias.to(x_dtype).to(bias_dtype), None


pool_bias_relu_op.register_autograd(_backward, setup_context=_setup_context)

if INTERPRETED:
    @pool_bias_relu_op.register_fake
    def _(x, bias, flat):
        _check(x, bias)
        B, C, H, W = x.shape
        return _empty_out(x, flat), x.new_empty((B * (H // 2) * (W // 2), C),
                                                dtype=torch.int8)

    @pool_bias_relu_backward.register_fake
    def _(grad, code, H, W, channels_last):
        return (_empty_grad(grad, H, W, channels_last),
                grad.new_empty((grad.shape[1],), dtype=torch.float32))


def pool_bias_relu(x: torch.Tensor, bias: torch.Tensor, flat: bool = False) -> torch.Tensor:
    """relu(maxpool2(x + bias)) as BoxNet's later blocks run it (--triton-pool): x is the
    conv's output without its bias."""
    return pool_bias_relu_op(x, bias, flat)[0]
