"""BoxNet's third block's backward in Triton, from the pooled gradient and the pool's code:
the input, weight and bias gradients of Conv2d(16->64, 3x3, padding 1) -> + bias ->
MaxPool2d(2) -> ReLU in two kernels (`--triton-conv-pool-bwd`, after --triton-conv-pool).

Why: the unfused backward wrote the 537 MB full-resolution gradient (batch 1024) and read
it back twice; here it is made in registers from the pooled gradient and the code, never
written: ~0.67 GB moved against ~2.1 GB.

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import triton
import triton.language as tl

from core.errors import InputError
from kernels.rounding import POOL_DTYPES, TL_DTYPE, round_to_cvt
from kernels.triton_op import INTERPRETED, define_op, empty_4d, is_nhwc, launch
from kernels.trunk.window import DEAD, patch_row, pooled_pixels, where_code

C_IN, C_OUT = 16, 64    # conv3's channels, as kernels/trunk/conv_pool.py
# Launch shapes, the fastest timed on the H100 at the model's size (results/step.md):
# blocks of 64 pooled pixels, 4 warps, 264 programs; 132-1056 programs, blocks of 32 or
# 128 and 8 warps were slower.
XGRAD_BLOCK, XGRAD_WARPS = 64, 4
WGRAD_BLOCK, WGRAD_WARPS = 64, 4
PROGRAMS = 264          # persistent: 2 per H100 SM, each making its weight tiles once
# The loops not pipelined: Triton's default of 3 stages asked the input gradient for
# 368 KB of shared memory, where the H100 has 227 KB.
STAGES = 1
# fp32 ("ieee": no tensor cores) unrolls its products into FMAs, whose compile time grows
# with the tile (as in kernels/trunk/second_block.py), and whose operand layout copies
# tiles to every thread: ptxas spilled 7,040 (input gradient) and 9,120 (weight) bytes of
# stack a thread at 16 pixels and 4 warps, which the CUDA driver reserves for every
# thread the GPU holds while the process lives (kernels/trunk/conv_pool.py). Smaller
# blocks and 8 warps for it: 6,656 and 40 bytes (1.8 and 0.01 GB on the H100;
# bench/kernel_stack.py). The model's bf16 step never runs it.
FP32_BLOCK, FP32_WARPS = 16, 8
PARTIALS = 3 * C_OUT * 4 * C_IN + C_OUT  # per program: A_0, A_1, A_2, then dL/dbias


@triton.jit
def _neighbour(g_ptr, code_ptr, b, i, j, mask, di: tl.constexpr, dj: tl.constexpr, H2, W2,
               sgb, sgc, sgh, sgw, CO: tl.constexpr):
    """The pooled gradient and code [BLOCK, CO] of the neighbours (i+di, j+dj); code 4
    (no gradient) outside the image."""
    co = tl.arange(0, CO)
    row = i + di
    col = j + dj
    ok = (mask & (row >= 0) & (row < H2) & (col >= 0) & (col < W2))[:, None]
    g = tl.load(g_ptr + (b * sgb + row * sgh + col * sgw)[:, None] + co[None, :] * sgc,
                mask=ok, other=0)
    code = tl.load(code_ptr + (((b * H2 + row) * W2 + col) * CO)[:, None] + co[None, :],
                   mask=ok, other=DEAD)
    return g, code


@triton.jit
def _segment(top, bottom, g, code, d: tl.constexpr, w_top, w_bottom, TOP: tl.constexpr,
             BOTTOM: tl.constexpr, DOT: tl.constexpr, PRECISION: tl.constexpr):
    """F_(u,v) = g where code == d: its dots into the quad's top row (w_top = V_(2-u),v)
    and bottom row (w_bottom = V_(3-u),v), where the kernel reaches them."""
    f = where_code(g.to(DOT), code, d, DOT)
    if TOP:
        top = tl.dot(f, w_top, top, input_precision=PRECISION)
    if BOTTOM:
        bottom = tl.dot(f, w_bottom, bottom, input_precision=PRECISION)
    return top, bottom


@triton.jit
def _xgrad_weights(w_ptr, ky: tl.constexpr, v: tl.constexpr, swo, swi, swh, sww,
                   CI: tl.constexpr, CO: tl.constexpr, DOT: tl.constexpr,
                   ROUND: tl.constexpr):
    """V_ky,v [CO, 2*CI]: row co, column e*CI + ci holds w[co, ci, ky, e - v + 2] rounded
    to ROUND, 0 off the kernel."""
    co = tl.arange(0, CO)
    n = tl.arange(0, 2 * CI)
    kx = n // CI - v + 2
    ok = (kx >= 0) & (kx < 3)
    ptrs = w_ptr + (co * swo)[:, None] + ((n % CI) * swi + ky * swh + kx * sww)[None, :]
    w = tl.load(ptrs, mask=ok[None, :], other=0).to(tl.float32)
    return round_to_cvt(w, ROUND).to(DOT)  # exact: DOT holds ROUND's values


@triton.jit
def _store_row(dx_ptr, acc, b, i, j, mask, a: tl.constexpr, sxb, sxc, sxh, sxw,
               CI: tl.constexpr, ROUND: tl.constexpr):
    """dL/dx at input row 2i+a, columns 2j+e, channel ci (column e*CI + ci of acc),
    rounded once to x's dtype (by round_to_cvt: the interpreter truncates a cast to bf16)."""
    n = tl.arange(0, 2 * CI)
    ptrs = (dx_ptr + (b * sxb + (2 * i + a) * sxh)[:, None]
            + (2 * j[:, None] + (n // CI)[None, :]) * sxw + ((n % CI) * sxc)[None, :])
    tl.store(ptrs, round_to_cvt(acc, ROUND).to(dx_ptr.dtype.element_ty), mask=mask[:, None])


@triton.jit
def _conv_pool_xgrad_kernel(g_ptr, code_ptr, w_ptr, dx_ptr, n_pooled, H2, W2,
                            sgb, sgc, sgh, sgw, swo, swi, swh, sww, sxb, sxc, sxh, sxw,
                            CI: tl.constexpr, CO: tl.constexpr, BLOCK: tl.constexpr,
                            DOT: tl.constexpr, ROUND: tl.constexpr,
                            PRECISION: tl.constexpr, STAGES: tl.constexpr):
    """Persistent: the twelve weight tiles V_ky,v are made once per program, which then
    walks blocks pid, pid + programs, ... For each of the nine pooled neighbours, its
    segments (u, v) of the rows F_u: u = 0 is neighbour row -1 at dy = 1; u = 1, 2 row 0
    at dy = 0, 1; u = 3 row +1 at dy = 0 (v and dx alike over the columns); each feeds
    the top row through V_(2-u),v and the bottom row through V_(3-u),v, as far as the
    kernel's three rows reach."""
    w00 = _xgrad_weights(w_ptr, 0, 0, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w01 = _xgrad_weights(w_ptr, 0, 1, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w02 = _xgrad_weights(w_ptr, 0, 2, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w03 = _xgrad_weights(w_ptr, 0, 3, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w10 = _xgrad_weights(w_ptr, 1, 0, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w11 = _xgrad_weights(w_ptr, 1, 1, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w12 = _xgrad_weights(w_ptr, 1, 2, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w13 = _xgrad_weights(w_ptr, 1, 3, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w20 = _xgrad_weights(w_ptr, 2, 0, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w21 = _xgrad_weights(w_ptr, 2, 1, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w22 = _xgrad_weights(w_ptr, 2, 2, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    w23 = _xgrad_weights(w_ptr, 2, 3, swo, swi, swh, sww, CI, CO, DOT, ROUND)
    for blk in tl.range(tl.program_id(0), tl.cdiv(n_pooled, BLOCK), tl.num_programs(0),
                        num_stages=STAGES):
        p, b, i, j, mask = pooled_pixels(blk, n_pooled, H2, W2, BLOCK)
        top = tl.zeros((BLOCK, 2 * CI), dtype=tl.float32)
        bottom = tl.zeros((BLOCK, 2 * CI), dtype=tl.float32)
        # (u, v), d = 2 dy + dx, the weights (top, bottom); the flags say which are used.
        g, code = _neighbour(g_ptr, code_ptr, b, i, j, mask, -1, -1, H2, W2, sgb, sgc, sgh,
                             sgw, CO)
        top, bottom = _segment(top, bottom, g, code, 3, w20, w20, True, False, DOT,
                               PRECISION)  # (0, 0)
        g, code = _neighbour(g_ptr, code_ptr, b, i, j, mask, -1, 0, H2, W2, sgb, sgc, sgh,
                             sgw, CO)
        top, bottom = _segment(top, bottom, g, code, 2, w21, w21, True, False, DOT,
                               PRECISION)  # (0, 1)
        top, bottom = _segment(top, bottom, g, code, 3, w22, w22, True, False, DOT,
                               PRECISION)  # (0, 2)
        g, code = _neighbour(g_ptr, code_ptr, b, i, j, mask, -1, 1, H2, W2, sgb, sgc, sgh,
                             sgw, CO)
        top, bottom = _segment(top, bottom, g, code, 2, w23, w23, True, False, DOT,
                               PRECISION)  # (0, 3)
        g, code = _neighbour(g_ptr, code_ptr, b, i, j, mask, 0, -1, H2, W2, sgb, sgc, sgh,
                             sgw, CO)
        top, bottom = _segment(top, bottom, g, code, 1, w10, w20, True, True, DOT,
                               PRECISION)  # (1, 0)
        top, bottom = _segment(top, bottom, g, code, 3, w00, w10, True, True, DOT,
                               PRECISION)  # (2, 0)
        g, code = _neighbour(g_ptr, code_ptr, b, i, j, mask, 0, 0, H2, W2, sgb, sgc, sgh,
                             sgw, CO)
        top, bottom = _segment(top, bottom, g, code, 0, w11, w21, True, True, DOT,
                               PRECISION)  # (1, 1)
        top, bottom = _segment(top, bottom, g, code, 1, w12, w22, True, True, DOT,
                               PRECISION)  # (1, 2)
        top, bottom = _segment(top, bottom, g, code, 2, w01, w11, True, True, DOT,
                               PRECISION)  # (2, 1)
        top, bottom = _segment(top, bottom, g, code, 3, w02, w12, True, True, DOT,
                               PRECISION)  # (2, 2)
        g, code = _neighbour(g_ptr, code_ptr, b, i, j, mask, 0, 1, H2, W2, sgb, sgc, sgh,
                             sgw, CO)
        top, bottom = _segment(top, bottom, g, code, 0, w13, w23, True, True, DOT,
                               PRECISION)  # (1, 3)
        top, bottom = _segment(top, bottom, g, code, 2, w03, w13, True, True, DOT,
                               PRECISION)  # (2, 3)
        g, code = _neighbour(g_ptr, code_ptr, b, i, j, mask, 1, -1, H2, W2, sgb, sgc, sgh,
                             sgw, CO)
        top, bottom = _segment(top, bottom, g, code, 1, w00, w00, False, True, DOT,
                               PRECISION)  # (3, 0)
        g, code = _neighbour(g_ptr, code_ptr, b, i, j, mask, 1, 0, H2, W2, sgb, sgc, sgh,
                             sgw, CO)
        top, bottom = _segment(top, bottom, g, code, 0, w01, w01, False, True, DOT,
                               PRECISION)  # (3, 1)
        top, bottom = _segment(top, bottom, g, code, 1, w02, w02, False, True, DOT,
                               PRECISION)  # (3, 2)
        g, code = _neighbour(g_ptr, code_ptr, b, i, j, mask, 1, 1, H2, W2, sgb, sgc, sgh,
                             sgw, CO)
        top, bottom = _segment(top, bottom, g, code, 0, w03, w03, False, True, DOT,
                               PRECISION)  # (3, 3)
        _store_row(dx_ptr, top, b, i, j, mask, 0, sxb, sxc, sxh, sxw, CI, ROUND)
        _store_row(dx_ptr, bottom, b, i, j, mask, 1, sxb, sxc, sxh, sxw, CI, ROUND)


@triton.jit
def _masked_t(g, code, d: tl.constexpr, DOT: tl.constexpr):
    """G_d^T [CO, BLOCK]."""
    return tl.trans(where_code(g.to(DOT), code, d, DOT))


@triton.jit
def _wgrad_column(acc0, acc1, acc2, x_ptr, g, code, b, i, j, mask, dx: tl.constexpr, H, W,
                  sxb, sxc, sxh, sxw, CI: tl.constexpr, DOT: tl.constexpr,
                  PRECISION: tl.constexpr):
    """The six dots of window column dx: A_ky += G_(dy,dx)^T @ R^dx_(dy+ky)."""
    g0 = _masked_t(g, code, dx, DOT)        # d = (0, dx)
    g1 = _masked_t(g, code, 2 + dx, DOT)    # d = (1, dx)
    r = patch_row(x_ptr, b, i, j, mask, 0, dx, H, W, sxb, sxc, sxh, sxw, CI, DOT)
    acc0 = tl.dot(g0, r, acc0, input_precision=PRECISION)
    r = patch_row(x_ptr, b, i, j, mask, 1, dx, H, W, sxb, sxc, sxh, sxw, CI, DOT)
    acc1 = tl.dot(g0, r, acc1, input_precision=PRECISION)
    acc0 = tl.dot(g1, r, acc0, input_precision=PRECISION)
    r = patch_row(x_ptr, b, i, j, mask, 2, dx, H, W, sxb, sxc, sxh, sxw, CI, DOT)
    acc2 = tl.dot(g0, r, acc2, input_precision=PRECISION)
    acc1 = tl.dot(g1, r, acc1, input_precision=PRECISION)
    r = patch_row(x_ptr, b, i, j, mask, 3, dx, H, W, sxb, sxc, sxh, sxw, CI, DOT)
    acc2 = tl.dot(g1, r, acc2, input_precision=PRECISION)
    return acc0, acc1, acc2


@triton.jit
def _conv_pool_wgrad_kernel(x_ptr, g_ptr, code_ptr, part_ptr, n_pooled, H, W, H2, W2,
                            sxb, sxc, sxh, sxw, sgb, sgc, sgh, sgw,
                            CI: tl.constexpr, CO: tl.constexpr, BLOCK: tl.constexpr,
                            DOT: tl.constexpr, PRECISION: tl.constexpr,
                            STAGES: tl.constexpr):
    """Persistent: each program walks blocks pid, pid + programs, ... and writes one row
    of partial sums: A_0, A_1, A_2 [CO, 4*CI] each, then dL/dbias [CO]."""
    pid = tl.program_id(0)
    co = tl.arange(0, CO)
    acc0 = tl.zeros((CO, 4 * CI), dtype=tl.float32)
    acc1 = tl.zeros((CO, 4 * CI), dtype=tl.float32)
    acc2 = tl.zeros((CO, 4 * CI), dtype=tl.float32)
    acc_bias = tl.zeros((CO,), dtype=tl.float32)
    for blk in tl.range(pid, tl.cdiv(n_pooled, BLOCK), tl.num_programs(0),
                        num_stages=STAGES):
        p, b, i, j, mask = pooled_pixels(blk, n_pooled, H2, W2, BLOCK)
        code = tl.load(code_ptr + p.to(tl.int64)[:, None] * CO + co[None, :],
                       mask=mask[:, None], other=DEAD)
        g = tl.load(g_ptr + (b * sgb + i * sgh + j * sgw)[:, None] + co[None, :] * sgc,
                    mask=mask[:, None], other=0)
        g = tl.where(code < DEAD, g, 0)  # in x's dtype: fewer registers than fp32
        acc_bias += tl.sum(g.to(tl.float32), axis=0)
        acc0, acc1, acc2 = _wgrad_column(acc0, acc1, acc2, x_ptr, g, code, b, i, j, mask,
                                         0, H, W, sxb, sxc, sxh, sxw, CI, DOT, PRECISION)
        acc0, acc1, acc2 = _wgrad_column(acc0, acc1, acc2, x_ptr, g, code, b, i, j, mask,
                                         1, H, W, sxb, sxc, sxh, sxw, CI, DOT, PRECISION)
    part = part_ptr + pid.to(tl.int64) * (3 * CO * 4 * CI + CO)
    tile = co[:, None] * (4 * CI) + tl.arange(0, 4 * CI)[None, :]
    tl.store(part + tile, acc0)
    tl.store(part + CO * 4 * CI + tile, acc1)
    tl.store(part + 2 * CO * 4 * CI + tile, acc2)
    tl.store(part + 3 * CO * 4 * CI + co, acc_bias)


def _check(grad, code, x, weight) -> None:
    B, _, H, W = x.shape
    pooled = (B, C_OUT, H // 2, W // 2)
    if x.dim() != 4 or x.shape[1] != C_IN or x.dtype not in POOL_DTYPES or H % 2 or W % 2:
        raise InputError(f"conv_pool_backward takes fp32, bf16 or fp16 x [B, {C_IN}, H, W] "
                         f"with H and W even, got {x.dtype} {tuple(x.shape)}")
    if tuple(grad.shape) != pooled or grad.dtype != x.dtype:
        raise InputError(f"conv_pool_backward's gradient must be {x.dtype} {pooled}, got "
                         f"{grad.dtype} {tuple(grad.shape)}")
    if tuple(code.shape) != (B * (H // 2) * (W // 2), C_OUT) or code.dtype != torch.int8 \
            or not code.is_contiguous():
        raise InputError("conv_pool_backward's code must be the forward's contiguous int8 "
                         f"[B*H/2*W/2, {C_OUT}], got {code.dtype} {tuple(code.shape)}")
    if tuple(weight.shape) != (C_OUT, C_IN, 3, 3) or not weight.is_floating_point():
        raise InputError(f"conv_pool_backward's weight must be [{C_OUT}, {C_IN}, 3, 3] "
                         f"floating point, got {weight.dtype} {tuple(weight.shape)}")
    if not grad.device == code.device == x.device == weight.device:
        raise InputError("conv_pool_backward's tensors must be on one device")


def _dot_dtype(x: torch.Tensor):
    """The dots' operand dtype: x's on a GPU; fp32 under the interpreter, whose dot takes
    no bf16 or fp16 (it then holds values rounded to x's dtype)."""
    return tl.float32 if INTERPRETED else TL_DTYPE[x.dtype]


def _programs(n_pooled: int, block: int) -> int:
    return max(1, min(triton.cdiv(n_pooled, block), PROGRAMS))


def _block(x: torch.Tensor, block: int) -> int:
    return FP32_BLOCK if x.dtype == torch.float32 else block


def _warps(x: torch.Tensor, warps: int) -> int:
    return FP32_WARPS if x.dtype == torch.float32 else warps


def _input_grad(grad, code, x, weight) -> torch.Tensor:
    B, _, H, W = x.shape
    dx = empty_4d(tuple(x.shape), x.dtype, x.device, is_nhwc(x))
    n_pooled = code.shape[0]
    block = _block(x, XGRAD_BLOCK)
    launch(_conv_pool_xgrad_kernel, (_programs(n_pooled, block),), grad, code,
           weight, dx, n_pooled, H // 2, W // 2, *grad.stride(), *weight.stride(),
           *dx.stride(), CI=C_IN, CO=C_OUT, BLOCK=block, DOT=_dot_dtype(x),
           ROUND=TL_DTYPE[x.dtype], PRECISION="ieee", STAGES=STAGES,
           num_warps=_warps(x, XGRAD_WARPS))
    return dx


def _weight_sums(grad, code, x) -> torch.Tensor:
    """[PARTIALS] fp32: A_0, A_1, A_2 and dL/dbias summed over the programs."""
    B, _, H, W = x.shape
    n_pooled = code.shape[0]
    block = _block(x, WGRAD_BLOCK)
    programs = _programs(n_pooled, block)
    part = torch.empty((programs, PARTIALS), dtype=torch.float32, device=x.device)
    launch(_conv_pool_wgrad_kernel, (programs,), x, grad, code, part, n_pooled, H, W,
           H // 2, W // 2, *x.stride(), *grad.stride(), CI=C_IN, CO=C_OUT,
           BLOCK=block, DOT=_dot_dtype(x), PRECISION="ieee", STAGES=STAGES,
           num_warps=_warps(x, WGRAD_WARPS))
    return part.sum(0)


@define_op("boxnet::conv_pool_backward", mutates_args=())
def conv_pool_backward(grad: torch.Tensor, code: torch.Tensor, x: torch.Tensor,
                       weight: torch.Tensor,
                       input_grad: bool) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dL/dx in x's dtype and layout, or an empty tensor where not input_grad; dL/dw
    [64, 16, 3, 3] and dL/dbias [64] in fp32, not yet rounded) of the third block, from
    its pooled gradient and the forward's code: two launches and one reduction."""
    _check(grad, code, x, weight)
    dx = _input_grad(grad, code, x, weight) if input_grad else x.new_empty((0,))
    sums = _weight_sums(grad, code, x)
    a = sums[:-C_OUT].view(3, C_OUT, 4, C_IN)[:, :, :3, :]  # [ky, co, kx, ci]
    d_w = torch.empty_like(weight, dtype=torch.float32)  # the weight's layout, as cuDNN's
    d_w.copy_(a.permute(1, 3, 0, 2))
    return dx, d_w, sums[-C_OUT:].clone()


if INTERPRETED:
    @conv_pool_backward.register_fake
    def _(grad, code, x, weight, input_grad):
        dx = (empty_4d(tuple(x.shape), x.dtype, x.device, is_nhwc(x)) if input_grad
              else x.new_empty((0,)))
        return (dx, torch.empty_like(weight, dtype=torch.float32),
                x.new_empty((C_OUT,), dtype=torch.float32))
