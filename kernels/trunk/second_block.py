"""BoxNet's second block in Triton: Conv2d(4->16, 3x3, padding 1) + bias -> MaxPool2d(2) ->
ReLU, forward in one kernel, backward in two (`--triton-second-block`).

Why: cuDNN's kernels waste most of their tiles on 4 input channels, and the eager pool and
ReLU write and read the 537 MB full-resolution conv output (batch 1024); here it never
leaves registers: ~0.3 GB a pass.

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import triton
import triton.language as tl

from core.checks import check_conv_block
from core.errors import InputError
from kernels.rounding import TL_DTYPE
from kernels.triton_op import INTERPRETED, define_op, empty_4d, is_nhwc, launch
from kernels.trunk.window import first_max, pooled_pixels, where_code

C_IN, C_OUT = 4, 16     # conv2's channels: the kernels are written for this block
# Launch shapes for bf16 and fp16, the fastest timed on the H100 at the model's size
# (results/archive/step.md).
BLOCK = 128             # pooled pixels per block (the dots' M), forward and weight grad
NUM_WARPS = 4
WGRAD_PROGRAMS = 528    # 4 per H100 SM: enough to fill it, few partial sums to add
XGRAD_BLOCK = 64        # pooled pixels (input quads) per program of the input gradient
XGRAD_WARPS = 4
XGRAD_PROGRAMS = 1056   # 8 per H100 SM, each walking blocks (the weights made once each)
# One stage: pipelined (Triton's default of 3 stages), the persistent loop asked for 248 KB
# of shared memory, where the H100 has 227 KB.
# fp32 ("ieee": no tensor cores) and fp64 (no dot at all) unroll their products into
# plain FMAs, whose compile time grows with the tile: at the bf16 blocks the fp32 kernels
# took 40 s to compile and the fp64 ones over a minute each (triton.compile for sm_90,
# timed on the CPU machine); these blocks take ~10 s. Neither runs in the model's bf16 step.
SMALL_BLOCKS = {torch.float32: (32, 16), torch.float64: (16, 16)}
PARTIALS = 4 * C_OUT * 64 + C_OUT  # per program: dL/dW_d for d = 0..3, then dL/dbias


@triton.jit
def _operand(v, DOT: tl.constexpr, ROUND: tl.constexpr):
    """A dot operand: rounded to ROUND (x's dtype, as autocast rounds the weight), held
    in DOT. On a GPU both are x's dtype; the interpreter's dot cannot take bf16 or fp16,
    so there it is fp32 holding the rounded values."""
    return v.to(ROUND).to(DOT)


@triton.jit
def _mm(a, b, PRECISION: tl.constexpr):
    """a @ b with fp32 (fp64) accumulation: a tensor-core dot, or for fp64 ("fma") the
    broadcast product summed, as Triton's fp64 MMA takes no K this large (an assertion in
    its MMAv2 lowering; fp64 is only gradcheck's)."""
    if PRECISION == "fma":
        return tl.sum(a[:, :, None] * b[None, :, :], axis=1)
    else:
        return tl.dot(a, b, input_precision=PRECISION)


@triton.jit
def _patch(x_ptr, b, i, j, mask, H, W, sxb, sxc, sxh, SXW, DOT: tl.constexpr,
           ROUND: tl.constexpr):
    """P: the [BLOCK, 64] input patches of pooled pixels (b, i, j) (window.pooled_pixels's),
    column (py*4 + px)*4 + ci holding x[b, ci, 2i-1+py, 2j-1+px] (0 outside the image)."""
    k = tl.arange(0, 64)
    r = 2 * i[:, None] - 1 + (k // 16)[None, :]
    c = 2 * j[:, None] - 1 + ((k // 4) % 4)[None, :]
    inside = mask[:, None] & (r >= 0) & (r < H) & (c >= 0) & (c < W)
    ptrs = x_ptr + b[:, None] * sxb + (k % 4)[None, :] * sxc + r * sxh + c * SXW
    return _operand(tl.load(ptrs, mask=inside, other=0), DOT, ROUND)


@triton.jit
def _window_weights(w_ptr, dy: tl.constexpr, dx: tl.constexpr, swo, swi, swh, sww,
                    DOT: tl.constexpr, ROUND: tl.constexpr):
    """W_d [64, 16] for window position (dy, dx): w[co, ci, py-dy, px-dx], 0 off the kernel."""
    k = tl.arange(0, 64)
    co = tl.arange(0, 16)
    ky = k // 16 - dy
    kx = (k // 4) % 4 - dx
    ok = (ky >= 0) & (ky < 3) & (kx >= 0) & (kx < 3)
    ptrs = w_ptr + co[None, :] * swo + ((k % 4) * swi + ky * swh + kx * sww)[:, None]
    return _operand(tl.load(ptrs, mask=ok[:, None], other=0), DOT, ROUND)


@triton.jit
def _windows(patch, w0, w1, w2, w3, bias, PRECISION: tl.constexpr):
    """The four conv values (+ bias) of each pooled pixel's 2x2 window, [BLOCK, 16] each."""
    v0 = _mm(patch, w0, PRECISION) + bias[None, :]
    v1 = _mm(patch, w1, PRECISION) + bias[None, :]
    v2 = _mm(patch, w2, PRECISION) + bias[None, :]
    v3 = _mm(patch, w3, PRECISION) + bias[None, :]
    return v0, v1, v2, v3


# Sizes and the batch and row strides are not specialised on their divisibility by 16, so
# each dtype and layout compiles once, not once per image size (the GPU tests took
# minutes of compiling); torch.compile's launches specialise them anyway. Channel strides
# keep Triton's specialisation: 1 under channels_last. x's (and dL/dx's) column stride is
# a constexpr, SXW: 4 under channels_last (the 4 channels), 1 otherwise. Triton
# specialises an int only when it is 1 or divisible by 16, so with SXW a plain argument
# it could not see that a patch row's pixels are adjacent and loaded x two bytes at a
# time; as a constexpr the loads (and dL/dx's stores) are vectors (what that saved at
# the model's size: results/step.md).
_GENERIC = ["n_pooled", "H", "W", "H2", "W2", "sxb", "sxh", "syb", "syh", "syw",
            "sgb", "sgh", "sgw"]


@triton.jit(do_not_specialize_on_alignment=_GENERIC)
def _second_block_fwd_kernel(x_ptr, w_ptr, bias_ptr, y_ptr, sel_ptr, n_pooled, H, W, H2, W2,
                             sxb, sxc, sxh, SXW: tl.constexpr, swo, swi, swh, sww, syb, syc,
                             syh, syw,
                             BLOCK_: tl.constexpr, DOT: tl.constexpr, ROUND: tl.constexpr,
                             ACC: tl.constexpr, PRECISION: tl.constexpr):
    offs, b, i, j, mask = pooled_pixels(tl.program_id(0), n_pooled, H2, W2, BLOCK_)
    co = tl.arange(0, 16)
    patch = _patch(x_ptr, b, i, j, mask, H, W, sxb, sxc, sxh, SXW, DOT, ROUND)
    bias = tl.load(bias_ptr + co).to(ACC)
    w0 = _window_weights(w_ptr, 0, 0, swo, swi, swh, sww, DOT, ROUND)
    w1 = _window_weights(w_ptr, 0, 1, swo, swi, swh, sww, DOT, ROUND)
    w2 = _window_weights(w_ptr, 1, 0, swo, swi, swh, sww, DOT, ROUND)
    w3 = _window_weights(w_ptr, 1, 1, swo, swi, swh, sww, DOT, ROUND)
    v0, v1, v2, v3 = _windows(patch, w0, w1, w2, w3, bias, PRECISION)
    sel, m = first_max(v0, v1, v2, v3)
    y = tl.maximum(m, 0.0)
    # d* for the backward: 4 where the ReLU is dead (no gradient passes).
    tl.store(sel_ptr + offs.to(tl.int64)[:, None] * 16 + co[None, :],
             tl.where(m > 0.0, sel, 4).to(tl.int8), mask=mask[:, None])
    ptrs = (y_ptr + (b * syb + i * syh + j * syw)[:, None]
            + co[None, :] * syc)
    tl.store(ptrs, y.to(y_ptr.dtype.element_ty), mask=mask[:, None])


@triton.jit(do_not_specialize_on_alignment=_GENERIC)
def _second_block_wgrad_kernel(x_ptr, grad_ptr, sel_ptr, part_ptr, n_pooled, H, W, H2, W2,
                               sxb, sxc, sxh, SXW: tl.constexpr, sgb, sgc, sgh, sgw,
                               BLOCK_: tl.constexpr,
                               DOT: tl.constexpr, ROUND: tl.constexpr, ACC: tl.constexpr,
                               PRECISION: tl.constexpr):
    """Persistent: each program walks blocks pid, pid + programs, ... and writes one row
    of partial sums: dL/dW_d [4, 16, 64] and dL/dbias [16]. d* is the forward's. Each
    dL/dW_d is summed as P^T @ G_d ([64, BLOCK_] x [BLOCK_, 16]: M = 64 fills a Hopper
    warpgroup's MMA, where G_d^T @ P has M = 16)."""
    pid = tl.program_id(0)
    co = tl.arange(0, 16)
    acc0 = tl.zeros((64, 16), dtype=ACC)
    acc1 = tl.zeros((64, 16), dtype=ACC)
    acc2 = tl.zeros((64, 16), dtype=ACC)
    acc3 = tl.zeros((64, 16), dtype=ACC)
    acc_bias = tl.zeros((16,), dtype=ACC)
    for blk in range(pid, tl.cdiv(n_pooled, BLOCK_), tl.num_programs(0)):
        offs, b, i, j, mask = pooled_pixels(blk, n_pooled, H2, W2, BLOCK_)
        patch_t = tl.trans(_patch(x_ptr, b, i, j, mask, H, W, sxb, sxc, sxh, SXW, DOT, ROUND))
        sel = tl.load(sel_ptr + offs.to(tl.int64)[:, None] * 16 + co[None, :],
                      mask=mask[:, None], other=4)
        gptrs = grad_ptr + (b * sgb + i * sgh + j * sgw)[:, None] + co[None, :] * sgc
        g = tl.load(gptrs, mask=mask[:, None], other=0).to(ACC)
        g = tl.where(sel < 4, g, 0.0)
        acc_bias += tl.sum(g, axis=0)
        acc0 += _mm(patch_t, _operand(tl.where(sel == 0, g, 0.0), DOT, ROUND), PRECISION)
        acc1 += _mm(patch_t, _operand(tl.where(sel == 1, g, 0.0), DOT, ROUND), PRECISION)
        acc2 += _mm(patch_t, _operand(tl.where(sel == 2, g, 0.0), DOT, ROUND), PRECISION)
        acc3 += _mm(patch_t, _operand(tl.where(sel == 3, g, 0.0), DOT, ROUND), PRECISION)
    part = part_ptr + pid.to(tl.int64) * (4 * 16 * 64 + 16)
    tile = co[None, :] * 64 + tl.arange(0, 64)[:, None]  # stored [co, (py, px, ci)]
    tl.store(part + tile, acc0)
    tl.store(part + 1024 + tile, acc1)
    tl.store(part + 2048 + tile, acc2)
    tl.store(part + 3072 + tile, acc3)
    tl.store(part + 4096 + co, acc_bias)


@triton.jit
def _tap_weights(w_ptr, u: tl.constexpr, v: tl.constexpr, swo, swi, swh, sww,
                 DOT: tl.constexpr, ROUND: tl.constexpr):
    """T_uv [16, 16] for the conv position (2i-1+u, 2j-1+v) of quad (i, j): row co, column
    (a, e, ci) holds w[co, ci, a-u+2, e-v+2], the tap that joins input pixel (2i+a, 2j+e)
    to that position; 0 where the tap is off the 3x3 kernel."""
    co = tl.arange(0, 16)
    col = tl.arange(0, 16)
    ky = col // 8 - u + 2
    kx = (col // 4) % 2 - v + 2
    ok = (ky >= 0) & (ky < 3) & (kx >= 0) & (kx < 3)
    ptrs = w_ptr + co[:, None] * swo + ((col % 4) * swi + ky * swh + kx * sww)[None, :]
    return _operand(tl.load(ptrs, mask=ok[None, :], other=0), DOT, ROUND)


@triton.jit
def _neighbour(grad_ptr, sel_ptr, b, i, j, mask, H2, W2, sgb, sgc, sgh, sgw,
               di: tl.constexpr, dj: tl.constexpr, DOT: tl.constexpr, ROUND: tl.constexpr):
    """(g, d*) [BLOCK, 16] of the pooled neighbour (i+di, j+dj): its gradient as a dot
    operand, rounded once, and window choice per channel (0 and 4, no choice, off the
    image)."""
    co = tl.arange(0, 16)
    I = i + di  # noqa: E741 (the pooled row, as in the docstring's maths)
    J = j + dj
    ok = mask & (I >= 0) & (I < H2) & (J >= 0) & (J < W2)
    I = tl.where(ok, I, 0)  # noqa: E741
    J = tl.where(ok, J, 0)
    g = tl.load(grad_ptr + (b * sgb + I * sgh + J * sgw)[:, None] + co[None, :] * sgc,
                mask=ok[:, None], other=0)
    sel = tl.load(sel_ptr + (((b * H2 + I) * W2 + J) * 16)[:, None] + co[None, :],
                  mask=ok[:, None], other=4)
    return _operand(g, DOT, ROUND), sel


@triton.jit
def _tap_dot(acc, g, sel, d: tl.constexpr, t_uv, DOT: tl.constexpr,
             PRECISION: tl.constexpr):
    """acc + G @ T_uv, G the neighbour's gradient at the channels whose window chose
    position d (the conv position of T_uv), 0 at the others."""
    return acc + _mm(where_code(g, sel, d, DOT), t_uv, PRECISION)


@triton.jit(do_not_specialize_on_alignment=_GENERIC)
def _second_block_xgrad_kernel(grad_ptr, sel_ptr, w_ptr, dx_ptr, n_pooled, H2, W2,
                               sgb, sgc, sgh, sgw, swo, swi, swh, sww, sxb, sxc, sxh,
                               SXW: tl.constexpr,
                               BLOCK_: tl.constexpr, DOT: tl.constexpr,
                               ROUND: tl.constexpr, ACC: tl.constexpr,
                               PRECISION: tl.constexpr):
    """dL/dx for the 2x2 input quads under BLOCK_ pooled pixels (flat over b, i, j). The
    quad of (i, j) gets gradient from the 4x4 conv positions (2i-1+u, 2j-1+v), u, v in
    0..3, which belong to the pooled pixels (i-1..i+1, j-1..j+1): position u is
    neighbour row di = -1, 0, 0, 1 at window row dy = 1, 0, 1, 0 (v likewise for the
    column). So each of the nine neighbours is loaded once as [BLOCK_, 16] (gradient and
    d*), and each conv position is one [BLOCK_, 16] x [16, 16] dot: sixteen dots of K = 16,
    no structural zeros (rather than each neighbour as a [BLOCK_, 64] operand, four window
    positions side by side, from gathers that load every number four times).
    Persistent: the sixteen T_uv are made once per program, which then walks blocks pid,
    pid + programs, ..."""
    t00 = _tap_weights(w_ptr, 0, 0, swo, swi, swh, sww, DOT, ROUND)
    t01 = _tap_weights(w_ptr, 0, 1, swo, swi, swh, sww, DOT, ROUND)
    t02 = _tap_weights(w_ptr, 0, 2, swo, swi, swh, sww, DOT, ROUND)
    t03 = _tap_weights(w_ptr, 0, 3, swo, swi, swh, sww, DOT, ROUND)
    t10 = _tap_weights(w_ptr, 1, 0, swo, swi, swh, sww, DOT, ROUND)
    t11 = _tap_weights(w_ptr, 1, 1, swo, swi, swh, sww, DOT, ROUND)
    t12 = _tap_weights(w_ptr, 1, 2, swo, swi, swh, sww, DOT, ROUND)
    t13 = _tap_weights(w_ptr, 1, 3, swo, swi, swh, sww, DOT, ROUND)
    t20 = _tap_weights(w_ptr, 2, 0, swo, swi, swh, sww, DOT, ROUND)
    t21 = _tap_weights(w_ptr, 2, 1, swo, swi, swh, sww, DOT, ROUND)
    t22 = _tap_weights(w_ptr, 2, 2, swo, swi, swh, sww, DOT, ROUND)
    t23 = _tap_weights(w_ptr, 2, 3, swo, swi, swh, sww, DOT, ROUND)
    t30 = _tap_weights(w_ptr, 3, 0, swo, swi, swh, sww, DOT, ROUND)
    t31 = _tap_weights(w_ptr, 3, 1, swo, swi, swh, sww, DOT, ROUND)
    t32 = _tap_weights(w_ptr, 3, 2, swo, swi, swh, sww, DOT, ROUND)
    t33 = _tap_weights(w_ptr, 3, 3, swo, swi, swh, sww, DOT, ROUND)
    col = tl.arange(0, 16)
    for blk in range(tl.program_id(0), tl.cdiv(n_pooled, BLOCK_), tl.num_programs(0)):
        offs, b, i, j, mask = pooled_pixels(blk, n_pooled, H2, W2, BLOCK_)
        acc = tl.zeros((BLOCK_, 16), dtype=ACC)
        # Row above (u = 0: its window row dy = 1): d = 2*dy + dx.
        g, s = _neighbour(grad_ptr, sel_ptr, b, i, j, mask, H2, W2, sgb, sgc, sgh, sgw,
                          -1, -1, DOT, ROUND)
        acc = _tap_dot(acc, g, s, 3, t00, DOT, PRECISION)
        g, s = _neighbour(grad_ptr, sel_ptr, b, i, j, mask, H2, W2, sgb, sgc, sgh, sgw,
                          -1, 0, DOT, ROUND)
        acc = _tap_dot(acc, g, s, 2, t01, DOT, PRECISION)
        acc = _tap_dot(acc, g, s, 3, t02, DOT, PRECISION)
        g, s = _neighbour(grad_ptr, sel_ptr, b, i, j, mask, H2, W2, sgb, sgc, sgh, sgw,
                          -1, 1, DOT, ROUND)
        acc = _tap_dot(acc, g, s, 2, t03, DOT, PRECISION)
        # The quad's own row (u = 1, 2: dy = 0, 1).
        g, s = _neighbour(grad_ptr, sel_ptr, b, i, j, mask, H2, W2, sgb, sgc, sgh, sgw,
                          0, -1, DOT, ROUND)
        acc = _tap_dot(acc, g, s, 1, t10, DOT, PRECISION)
        acc = _tap_dot(acc, g, s, 3, t20, DOT, PRECISION)
        g, s = _neighbour(grad_ptr, sel_ptr, b, i, j, mask, H2, W2, sgb, sgc, sgh, sgw,
                          0, 0, DOT, ROUND)
        acc = _tap_dot(acc, g, s, 0, t11, DOT, PRECISION)
        acc = _tap_dot(acc, g, s, 1, t12, DOT, PRECISION)
        acc = _tap_dot(acc, g, s, 2, t21, DOT, PRECISION)
        acc = _tap_dot(acc, g, s, 3, t22, DOT, PRECISION)
        g, s = _neighbour(grad_ptr, sel_ptr, b, i, j, mask, H2, W2, sgb, sgc, sgh, sgw,
                          0, 1, DOT, ROUND)
        acc = _tap_dot(acc, g, s, 0, t13, DOT, PRECISION)
        acc = _tap_dot(acc, g, s, 2, t23, DOT, PRECISION)
        # Row below (u = 3: dy = 0).
        g, s = _neighbour(grad_ptr, sel_ptr, b, i, j, mask, H2, W2, sgb, sgc, sgh, sgw,
                          1, -1, DOT, ROUND)
        acc = _tap_dot(acc, g, s, 1, t30, DOT, PRECISION)
        g, s = _neighbour(grad_ptr, sel_ptr, b, i, j, mask, H2, W2, sgb, sgc, sgh, sgw,
                          1, 0, DOT, ROUND)
        acc = _tap_dot(acc, g, s, 0, t31, DOT, PRECISION)
        acc = _tap_dot(acc, g, s, 1, t32, DOT, PRECISION)
        g, s = _neighbour(grad_ptr, sel_ptr, b, i, j, mask, H2, W2, sgb, sgc, sgh, sgw,
                          1, 1, DOT, ROUND)
        acc = _tap_dot(acc, g, s, 0, t33, DOT, PRECISION)
        r = 2 * i[:, None] + (col // 8)[None, :]
        c = 2 * j[:, None] + ((col // 4) % 2)[None, :]
        ptrs = dx_ptr + b[:, None] * sxb + (col % 4)[None, :] * sxc + r * sxh + c * SXW
        tl.store(ptrs, acc.to(dx_ptr.dtype.element_ty), mask=mask[:, None])


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    if x.dim() != 4 or x.shape[1] != C_IN or not x.is_floating_point():
        raise InputError(f"second_block takes floating-point x [B, {C_IN}, H, W], got "
                         f"{x.dtype} {tuple(x.shape)}")
    check_conv_block("second_block", x, weight, bias, C_IN, C_OUT)


def _blocks(x) -> tuple[int, int]:
    """(BLOCK, XGRAD_BLOCK) for x's dtype. Triton's interpreter compiles nothing, so there
    every dtype takes the model's bf16 blocks: the shape that runs on the GPU, and a
    quarter of the programs (the interpreter's cost is per program)."""
    if INTERPRETED:
        return BLOCK, XGRAD_BLOCK
    return SMALL_BLOCKS.get(x.dtype, (BLOCK, XGRAD_BLOCK))


def _meta(x) -> dict:
    """The dots' operand and accumulator dtypes for x's dtype; IEEE fp32, never TF32."""
    acc = tl.float64 if x.dtype == torch.float64 else tl.float32
    dot = tl.float32 if INTERPRETED and acc == tl.float32 else TL_DTYPE[x.dtype]
    return dict(DOT=dot, ROUND=TL_DTYPE[x.dtype], ACC=acc,
                PRECISION="fma" if x.dtype == torch.float64 else "ieee")


def _pooled_shape(x):
    B, _, H, W = x.shape
    return B, H // 2, W // 2


@define_op("boxnet::second_block", mutates_args=())
def second_block_op(x: torch.Tensor, weight: torch.Tensor,
                    bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(relu(maxpool2(conv3x3(x) + bias)) [B, 16, H/2, W/2] in x's dtype and memory
    format, d* [B*H/2*W/2, 16] int8 for the backward): one launch."""
    _check(x, weight, bias)
    y, sel = _outputs(x)
    B, H2, W2 = _pooled_shape(x)
    n_pooled = B * H2 * W2
    block, _ = _blocks(x)
    launch(_second_block_fwd_kernel, (triton.cdiv(n_pooled, block),), x, weight, bias, y,
            sel, n_pooled, x.shape[2], x.shape[3], H2, W2, *x.stride(), *weight.stride(),
            *y.stride(), BLOCK_=block, num_warps=NUM_WARPS, **_meta(x))
    return y, sel


def _outputs(x):
    """y [B, 16, H/2, W/2] in x's dtype, channels_last when x is (the model's NHWC run),
    and d* [B*H/2*W/2, 16] int8."""
    B, H2, W2 = _pooled_shape(x)
    y = empty_4d((B, C_OUT, H2, W2), x.dtype, x.device, is_nhwc(x))
    return y, torch.empty((B * H2 * W2, C_OUT), dtype=torch.int8, device=x.device)


def _weight_grad(sums: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dL/dw [16, 4, 3, 3] from the summed dL/dW_d [4, 16, 64]: window position (dy, dx)
    saw kernel tap (ky, kx) at patch position (ky+dy, kx+dx)."""
    per_d = sums.view(2, 2, C_OUT, 4, 4, C_IN)  # dy, dx, co, py, px, ci
    d_w = sum(per_d[dy, dx, :, dy:dy + 3, dx:dx + 3, :] for dy in (0, 1) for dx in (0, 1))
    return d_w.permute(0, 3, 1, 2).contiguous().to(weight.dtype)


@define_op("boxnet::second_block_backward", mutates_args=())
def second_block_backward(grad: torch.Tensor, sel: torch.Tensor, x: torch.Tensor,
                          weight: torch.Tensor, bias: torch.Tensor
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dL/dx in x's dtype and format, dL/dweight [16, 4, 3, 3], dL/dbias [16] in bias's
    dtype) from the pooled gradient and the forward's d*: two launches and one
    reduction."""
    B, H2, W2 = _pooled_shape(x)
    H, W = x.shape[2], x.shape[3]
    n_pooled = B * H2 * W2
    block, xgrad_block = _blocks(x)
    programs = min(triton.cdiv(n_pooled, block), WGRAD_PROGRAMS)
    acc_dtype = torch.float64 if x.dtype == torch.float64 else torch.float32
    parts = torch.empty((programs, PARTIALS), dtype=acc_dtype, device=x.device)
    meta = _meta(x)
    launch(_second_block_wgrad_kernel, (programs,), x, grad, sel, parts, n_pooled, H, W,
            H2, W2, *x.stride(), *grad.stride(), BLOCK_=block, num_warps=NUM_WARPS, **meta)
    d_x = empty_4d(x.shape, x.dtype, x.device, is_nhwc(x))
    xgrad_programs = min(triton.cdiv(n_pooled, xgrad_block), XGRAD_PROGRAMS)
    launch(_second_block_xgrad_kernel, (xgrad_programs,), grad, sel,
            weight, d_x, n_pooled, H2, W2, *grad.stride(), *weight.stride(),
            *d_x.stride(), BLOCK_=xgrad_block, num_warps=XGRAD_WARPS,
            num_stages=1, **meta)
    sums = parts.sum(0)
    d_w = _weight_grad(sums[:4 * C_OUT * 64], weight)
    return d_x, d_w, sums[4 * C_OUT * 64:].to(bias.dtype).contiguous()


def _setup_context(ctx, inputs, output):
    x, weight, bias = inputs
    ctx.save_for_backward(x, weight, bias, output[1])


def _backward(ctx, grad, grad_sel):
    x, weight, bias, sel = ctx.saved_tensors
    return second_block_backward(grad, sel, x, weight, bias)


second_block_op.register_autograd(_backward, setup_context=_setup_context)

if INTERPRETED:
    @second_block_op.register_fake
    def _(x, weight, bias):
        _check(x, weight, bias)
        return _outputs(x)

    @second_block_backward.register_fake
    def _(grad, sel, x, weight, bias):
        return torch.empty_like(x), weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def second_block(x, weight, bias):
    """The block as BoxNet runs it with --triton-second-block (training/speedups/
    triton_second_block.py)."""
    return second_block_op(x, weight, bias)[0]
