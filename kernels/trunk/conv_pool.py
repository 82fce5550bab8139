"""BoxNet's third block's forward in Triton: Conv2d(16->64, 3x3, padding 1) -> + bias ->
MaxPool2d(2) -> ReLU in one kernel, writing the pool's int8 code (`--triton-conv-pool`).

Why: cuDNN's conv wrote its 537 MB full-resolution output (batch 1024) for the pool to read
back; here it never leaves registers: ~0.34 GB moved and 101 GFLOP of tensor-core work.

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from core.errors import InputError
from kernels.rounding import POOL_DTYPES, TL_DTYPE, round_to_cvt
from kernels.triton_op import INTERPRETED, define_op, empty_4d, is_nhwc, launch
from kernels.trunk.conv_pool_bwd import conv_pool_backward
from kernels.trunk.pool import pool_bias_relu_backward
from kernels.trunk.window import DEAD, patch_row, pooled_pixels

C_IN, C_OUT = 16, 64    # conv3's channels: the kernel is written for this block
# Launch shape, the fastest timed on the H100 at the model's size (results/step.md):
# blocks of 64 pooled pixels (the dots' M) by all 64 channels, 4 warps, 264 persistent
# programs (2 per SM), the loop not pipelined; one program per block, persistent blocks
# of 128 or 256, and two stages were slower.
BLOCK_P, NUM_WARPS = 64, 4
PROGRAMS = 264
STAGES = 1
# fp32 ("ieee": no tensor cores) runs its dots as FMAs, whose operand layout copies the
# weight tiles to every thread. At 64 pixels and 4 warps ptxas spilled a 55,728-byte stack
# frame a thread, and the CUDA driver reserves the largest frame launched for every
# thread the GPU holds, for the process's life: 15 GB of the H100. 16 pixels and 8 warps
# keep it to 920 bytes (0.25 GB; bench/kernel_stack.py). The model's bf16 step never
# runs fp32.
FP32_BLOCK, FP32_WARPS = 16, 8


@triton.jit
def _tap_weights(w_ptr, dx: tl.constexpr, ky: tl.constexpr, swo, swi, swh, sww,
                 CI: tl.constexpr, CO: tl.constexpr, DOT: tl.constexpr,
                 ROUND: tl.constexpr):
    """W_(dx,ky) [4*CI, CO]: row px*CI + ci holds w[co, ci, ky, px-dx] rounded to ROUND
    (x's dtype, as autocast casts the weight; by round_to_cvt, which the interpreter gets
    right), 0 off the kernel."""
    k = tl.arange(0, 4 * CI)
    co = tl.arange(0, CO)
    kx = k // CI - dx
    ok = (kx >= 0) & (kx < 3)
    ptrs = w_ptr + co[None, :] * swo + ((k % CI) * swi + ky * swh + kx * sww)[:, None]
    w = tl.load(ptrs, mask=ok[:, None], other=0).to(tl.float32)
    return round_to_cvt(w, ROUND).to(DOT)  # exact: DOT holds ROUND's values


@triton.jit
def _window_value(ra, rb, rc, wa, wb, wc, bias, ROUND: tl.constexpr,
                  PRECISION: tl.constexpr):
    """v_d: the three row dots summed in fp32, rounded as the conv's output, plus the
    bias, rounded again."""
    acc = tl.dot(ra, wa, input_precision=PRECISION)
    acc = tl.dot(rb, wb, acc, input_precision=PRECISION)
    acc = tl.dot(rc, wc, acc, input_precision=PRECISION)
    return round_to_cvt(round_to_cvt(acc, ROUND) + bias[None, :], ROUND)


@triton.jit
def _take(v, best, code, d: tl.constexpr):
    """The pool's scan: a later position wins only if strictly greater, or NaN."""
    take = (v > best) | (v != v)
    return tl.where(take, v, best), tl.where(take, d, code)


@triton.jit
def _conv_pool_block(x_ptr, y_ptr, code_ptr, blk, n_pooled, H, W, H2, W2, sxb, sxc, sxh,
                     sxw, syb, syc, syh, syw, w00, w01, w02, w10, w11, w12, bias,
                     CI: tl.constexpr, CO: tl.constexpr, BLOCK: tl.constexpr,
                     DOT: tl.constexpr, ROUND: tl.constexpr, PRECISION: tl.constexpr):
    """y and the code of BLOCK pooled pixels (flat over b, i, j) from block blk."""
    p, b, i, j, mask = pooled_pixels(blk, n_pooled, H2, W2, BLOCK)
    co = tl.arange(0, CO)
    r0 = patch_row(x_ptr, b, i, j, mask, 0, 0, H, W, sxb, sxc, sxh, sxw, CI, DOT)
    r1 = patch_row(x_ptr, b, i, j, mask, 1, 0, H, W, sxb, sxc, sxh, sxw, CI, DOT)
    r2 = patch_row(x_ptr, b, i, j, mask, 2, 0, H, W, sxb, sxc, sxh, sxw, CI, DOT)
    r3 = patch_row(x_ptr, b, i, j, mask, 3, 0, H, W, sxb, sxc, sxh, sxw, CI, DOT)
    best = _window_value(r0, r1, r2, w00, w01, w02, bias, ROUND, PRECISION)
    code = tl.zeros((BLOCK, CO), dtype=tl.int32)
    best, code = _take(_window_value(r0, r1, r2, w10, w11, w12, bias, ROUND, PRECISION),
                       best, code, 1)
    best, code = _take(_window_value(r1, r2, r3, w00, w01, w02, bias, ROUND, PRECISION),
                       best, code, 2)
    best, code = _take(_window_value(r1, r2, r3, w10, w11, w12, bias, ROUND, PRECISION),
                       best, code, 3)
    y = tl.where(best != best, best, tl.maximum(best, 0.0))  # relu keeps a NaN
    code = tl.where(best > 0.0, code, DEAD)
    tl.store(y_ptr + (b * syb + i * syh + j * syw)[:, None] + co[None, :] * syc,
             y.to(y_ptr.dtype.element_ty), mask=mask[:, None])
    tl.store(code_ptr + p.to(tl.int64)[:, None] * CO + co[None, :], code.to(tl.int8),
             mask=mask[:, None])


@triton.jit
def _conv_pool_fwd_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, code_ptr, n_pooled, H, W, H2, W2,
                          sxb, sxc, sxh, sxw, swo, swi, swh, sww, syb, syc, syh, syw,
                          CI: tl.constexpr, CO: tl.constexpr, BLOCK: tl.constexpr,
                          DOT: tl.constexpr, ROUND: tl.constexpr,
                          PRECISION: tl.constexpr, STAGES: tl.constexpr):
    """Persistent: the six weight tiles and the bias are made once per program, which
    then walks blocks pid, pid + programs, ..."""
    w00 = _tap_weights(w_ptr, 0, 0, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w01 = _tap_weights(w_ptr, 0, 1, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w02 = _tap_weights(w_ptr, 0, 2, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w10 = _tap_weights(w_ptr, 1, 0, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w11 = _tap_weights(w_ptr, 1, 1, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w12 = _tap_weights(w_ptr, 1, 2, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    bias = round_to_cvt(tl.load(bias_ptr + tl.arange(0, CO)).to(tl.float32), ROUND)
    for blk in tl.range(tl.program_id(0), tl.cdiv(n_pooled, BLOCK), tl.num_programs(0),
                        num_stages=STAGES):
        _conv_pool_block(x_ptr, y_ptr, code_ptr, blk, n_pooled, H, W, H2, W2, sxb, sxc,
                         sxh, sxw, syb, syc, syh, syw, w00, w01, w02, w10, w11, w12, bias,
                         CI, CO, BLOCK, DOT, ROUND, PRECISION)


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    if x.dim() != 4 or x.shape[1] != C_IN or x.dtype not in POOL_DTYPES:
        raise InputError(f"conv_pool_bias_relu takes fp32, bf16 or fp16 x [B, {C_IN}, H, W], "
                         f"got {x.dtype} {tuple(x.shape)}")
    if x.shape[2] % 2 or x.shape[3] % 2:
        raise InputError(f"conv_pool_bias_relu pools 2x2: H and W must be even, got "
                         f"{tuple(x.shape[2:])}")
    if tuple(weight.shape) != (C_OUT, C_IN, 3, 3) or not weight.is_floating_point():
        raise InputError(f"conv_pool_bias_relu's weight must be [{C_OUT}, {C_IN}, 3, 3] "
                         f"floating point, got {weight.dtype} {tuple(weight.shape)}")
    if tuple(bias.shape) != (C_OUT,) or not bias.is_floating_point():
        raise InputError(f"conv_pool_bias_relu's bias must be [{C_OUT}] floating point, got "
                         f"{bias.dtype} {tuple(bias.shape)}")
    if not x.device == weight.device == bias.device:
        raise InputError("conv_pool_bias_relu's tensors must be on one device")


def _meta(x: torch.Tensor) -> dict:
    dot = tl.float32 if INTERPRETED else TL_DTYPE[x.dtype]
    return dict(DOT=dot, ROUND=TL_DTYPE[x.dtype], PRECISION="ieee")


def _outputs(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """y [B, 64, H/2, W/2] in x's dtype and memory format, and the code [B*H/2*W/2, 64]."""
    B, _, H, W = x.shape
    y = empty_4d((B, C_OUT, H // 2, W // 2), x.dtype, x.device, is_nhwc(x))
    code = torch.empty((B * (H // 2) * (W // 2), C_OUT), dtype=torch.int8, device=x.device)
    return y, code


@define_op("boxnet::conv_pool_bias_relu", mutates_args=())
def conv_pool_bias_relu_op(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                           triton_backward: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(relu(maxpool2(conv3x3(x) + bias)) [B, 64, H/2, W/2], the pool's int8 code
    [B*H/2*W/2, 64], as kernels/trunk/pool.py writes it): one launch. triton_backward
    picks the backward (--triton-conv-pool-bwd): kernels/trunk/conv_pool_bwd.py's, or
    the pool's kernel and cuDNN's."""
    _check(x, weight, bias)
    B, _, H, W = x.shape
    y, code = _outputs(x)
    n_pooled = code.shape[0]
    block, warps = (FP32_BLOCK, FP32_WARPS) if x.dtype == torch.float32 else (BLOCK_P,
                                                                               NUM_WARPS)
    programs = min(triton.cdiv(n_pooled, block), PROGRAMS)
    launch(_conv_pool_fwd_kernel, (programs,), x, weight, bias, y, code, n_pooled, H, W,
           H // 2, W // 2, *x.stride(), *weight.stride(), *y.stride(), CI=C_IN, CO=C_OUT,
           BLOCK=block, STAGES=STAGES, num_warps=warps, **_meta(x))
    return y, code


def _setup_context(ctx, inputs, output):
    x, weight, bias, triton_backward = inputs
    ctx.save_for_backward(x, weight, output[1])
    ctx.bias_dtype = bias.dtype
    ctx.triton_backward = triton_backward


def _backward(ctx, grad_y, grad_code):
    """Either kernels/trunk/conv_pool_bwd.py's kernels, or the pool's backward (the
    full-resolution gradient from the code, the bias's sum), then cuDNN's input and
    weight gradients of the conv in x's dtype, as the unfused graph runs them under
    autocast. Both round dL/dw and dL/dbias to x's dtype, then to the parameters'."""
    x, weight, code = ctx.saved_tensors
    if ctx.triton_backward:
        d_x, d_w, d_bias = conv_pool_backward(grad_y.to(x.dtype), code, x, weight,
                                              ctx.needs_input_grad[0])
        return (d_x if ctx.needs_input_grad[0] else None,
                d_w.to(x.dtype).to(weight.dtype), d_bias.to(x.dtype).to(ctx.bias_dtype),
                None)
    g_full, d_bias = pool_bias_relu_backward(grad_y, code, x.shape[2], x.shape[3],
                                             is_nhwc(x))
    d_x, d_w, _ = torch.ops.aten.convolution_backward(
        g_full, x, weight.to(x.dtype), None, [1, 1], [1, 1], [1, 1], False, [0, 0], 1,
        [ctx.needs_input_grad[0], True, False])
    return d_x, d_w.to(weight.dtype), d_bias.to(x.dtype).to(ctx.bias_dtype), None


conv_pool_bias_relu_op.register_autograd(_backward, setup_context=_setup_context)

if INTERPRETED:
    @conv_pool_bias_relu_op.register_fake
    def _(x, weight, bias, triton_backward=False):
        _check(x, weight, bias)
        return _outputs(x)


def conv_pool_bias_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                        triton_backward: bool = False) -> torch.Tensor:
    """relu(maxpool2(conv3x3(x) + bias)) as BoxNet's third block runs it
    (--triton-conv-pool; --triton-conv-pool-bwd: triton_backward)."""
    return conv_pool_bias_relu_op(x, weight, bias, triton_backward)[0]


def unfused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The same block as --triton-pool runs it: cuDNN's conv without its bias in x's dtype
    (autocast's cast of the weight), then the pool kernel."""
    from kernels.trunk.pool import pool_bias_relu
    return pool_bias_relu(F.conv2d(x, weight.to(x.dtype), None, padding=1), bias)
