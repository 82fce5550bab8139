"""BoxNet's first block in Triton: uint8 image -> /255 -> Conv2d(1->4, 3x3, padding 1) + bias
-> MaxPool2d(2) -> ReLU, forward and backward, each one kernel (`--triton-first-block`).

Why: cuDNN has no good kernel for one input and four output channels; fused, the
full-resolution conv output is never written: the forward reads 67 MB and writes 134 MB
at batch 1024.

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import triton
import triton.language as tl

from core.checks import check_conv_block
from core.errors import InputError
from kernels.triton_op import INTERPRETED, define_op, empty_4d, launch
from kernels.trunk.first_block_walk import (
    CHANNELS,
    grads_from_sums,
    patch,
    persistent_sums,
    tl_compute,
    walk_sums,
)
from kernels.trunk.window import DEAD, first_max

BLOCK = 1024            # pooled pixels per program of the forward
# ... when it keeps the code: at 1024 (8 pixels a thread) ptxas spilled (255 registers,
# 88-byte frame); at 256 it holds 93 and ran fastest compiled on the H100 (results/step.md).
CODE_BLOCK = 256
# The backward's programs each walk blocks of BWD_BLOCK pooled pixels, keeping 40 running
# sums per lane (2 pixels a thread at 4 warps: 80 registers of sums).
BWD_BLOCK = 256
BWD_PROGRAMS = 1056     # 8 per H100 SM
NUM_WARPS = 4


@triton.jit
def _conv9(w_ptr, c: tl.constexpr, a0, a1, a2, b0, b1, b2, d0, d1, d2):
    """sum_{ky,kx} w[c, ky, kx] * patch[ky][kx], the patch given row by row."""
    w = w_ptr + c * 9
    return (tl.load(w) * a0 + tl.load(w + 1) * a1 + tl.load(w + 2) * a2
            + tl.load(w + 3) * b0 + tl.load(w + 4) * b1 + tl.load(w + 5) * b2
            + tl.load(w + 6) * d0 + tl.load(w + 7) * d1 + tl.load(w + 8) * d2)


@triton.jit
def _window(w_ptr, c: tl.constexpr, x00, x01, x02, x03, x10, x11, x12, x13, x20, x21, x22,
            x23, x30, x31, x32, x33):
    """The four conv values of channel c in the 2x2 pooling window: (0,0) (0,1) (1,0) (1,1)."""
    v00 = _conv9(w_ptr, c, x00, x01, x02, x10, x11, x12, x20, x21, x22)
    v01 = _conv9(w_ptr, c, x01, x02, x03, x11, x12, x13, x21, x22, x23)
    v10 = _conv9(w_ptr, c, x10, x11, x12, x20, x21, x22, x30, x31, x32)
    v11 = _conv9(w_ptr, c, x11, x12, x13, x21, x22, x23, x31, x32, x33)
    return v00, v01, v10, v11


@triton.jit
def _first_block_fwd_kernel(img_ptr, w_ptr, bias_ptr, out_ptr, code_ptr, H, W, W2,
                            n_pooled, sob, soc, soh, sow, BLOCK_: tl.constexpr,
                            COMPUTE: tl.constexpr, KEEP_CODE: tl.constexpr):
    """With KEEP_CODE, also the pool's code [B*H/2*W/2] int32, channel c's in byte c:
    the window position the backward's first_max would pick from the same fp32 values,
    or DEAD where the ReLU passes no gradient (what _first_block_bwd_kernel recomputes)."""
    b = tl.program_id(0)
    pid = tl.program_id(1)
    (offs, mask, i, j, x00, x01, x02, x03, x10, x11, x12, x13, x20, x21, x22, x23,
     x30, x31, x32, x33) = patch(img_ptr, b, pid, H, W, W2, n_pooled, BLOCK_, COMPUTE)
    out = out_ptr + b.to(tl.int64) * sob + i * soh + j * sow
    packed = tl.zeros(offs.shape, dtype=tl.int32)
    for c in tl.static_range(4):
        v00, v01, v10, v11 = _window(w_ptr, c, x00, x01, x02, x03, x10, x11, x12, x13,
                                     x20, x21, x22, x23, x30, x31, x32, x33)
        m = tl.maximum(tl.maximum(v00, v01), tl.maximum(v10, v11)) + tl.load(bias_ptr + c)
        y = tl.maximum(m, 0.0)
        tl.store(out + c * soc, y.to(out_ptr.dtype.element_ty), mask=mask)
        if KEEP_CODE:
            sel, first = first_max(v00, v01, v10, v11)
            code = tl.where(first + tl.load(bias_ptr + c) > 0.0, sel, DEAD)
            packed = packed | (code << (8 * c))
    if KEEP_CODE:  # one 4-byte store a pooled pixel: channel c's code in byte c
        tl.store(code_ptr + b.to(tl.int64) * n_pooled + offs, packed, mask=mask)


@triton.jit
def _pick(sel, p0, p1, p2, p3):
    return tl.where(sel == 0, p0, tl.where(sel == 1, p1, tl.where(sel == 2, p2, p3)))


@triton.jit
def _channel_sums(w_ptr, bias_ptr, known, c: tl.constexpr, grad, mask, sgc, s0, s1, s2, s3,
                  s4, s5, s6, s7, s8, s9, x00, x01, x02, x03, x10, x11, x12, x13, x20, x21,
                  x22, x23, x30, x31, x32, x33, COMPUTE: tl.constexpr):
    """Channel c's ten running sums (nine weight taps, the bias) plus this block's
    elementwise terms, kept per lane: no reduction until the program's last block. The
    window's choice recomputed from the patch (`known` unused: persistent_sums's
    CHANNEL)."""
    v00, v01, v10, v11 = _window(w_ptr, c, x00, x01, x02, x03, x10, x11, x12, x13,
                                 x20, x21, x22, x23, x30, x31, x32, x33)
    sel, m = first_max(v00, v01, v10, v11)
    active = (m + tl.load(bias_ptr + c)) > 0.0
    g = tl.load(grad + c * sgc, mask=mask, other=0).to(COMPUTE)
    g = tl.where(active & mask, g, 0.0)
    # Weight (ky, kx) saw pixel (dy*+ky, dx*+kx) of the 4x4 patch.
    return (s0 + g * _pick(sel, x00, x01, x10, x11), s1 + g * _pick(sel, x01, x02, x11, x12),
            s2 + g * _pick(sel, x02, x03, x12, x13), s3 + g * _pick(sel, x10, x11, x20, x21),
            s4 + g * _pick(sel, x11, x12, x21, x22), s5 + g * _pick(sel, x12, x13, x22, x23),
            s6 + g * _pick(sel, x20, x21, x30, x31), s7 + g * _pick(sel, x21, x22, x31, x32),
            s8 + g * _pick(sel, x22, x23, x32, x33), s9 + g)


@triton.jit
def _first_block_bwd_kernel(img_ptr, w_ptr, bias_ptr, grad_ptr, part_ptr, H, W, W2,
                            n_pooled, n_blocks, sgb, sgc, sgh, sgw, BLOCK_: tl.constexpr,
                            COMPUTE: tl.constexpr):
    """The walk, each window's choice recomputed from the image (no code: img_ptr stands
    in for the code's pointer, never read)."""
    persistent_sums(img_ptr, w_ptr, bias_ptr, img_ptr, grad_ptr, part_ptr, H, W, W2,
                     n_pooled, n_blocks, sgb, sgc, sgh, sgw, BLOCK_, COMPUTE,
                     _channel_sums, False)


def _check(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 1:
        raise InputError(f"first_block takes uint8 images [B, 1, H, W], got "
                         f"{images.dtype} {tuple(images.shape)}")
    check_conv_block("first_block", images, weight, bias, 1, CHANNELS)


def _empty_out(images, out_dtype, channels_last):
    B, _, H, W = images.shape
    return empty_4d((B, CHANNELS, H // 2, W // 2), out_dtype, images.device, channels_last)


def _grid(images, block):
    B, _, H, W = images.shape
    return (B, triton.cdiv((H // 2) * (W // 2), block))


def _empty_code(images, keep_code):
    """The pool's code [B*H/2*W/2] int32 (a byte a channel) when kept, else empty."""
    B, _, H, W = images.shape
    rows = B * (H // 2) * (W // 2) if keep_code else 0
    return torch.empty((rows,), dtype=torch.int32, device=images.device)


@define_op("boxnet::first_block", mutates_args=())
def first_block_op(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   out_dtype: torch.dtype, channels_last: bool,
                   keep_code: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(relu(maxpool2(conv3x3(images / 255) + bias)) [B, 4, H/2, W/2], the pool's code
    [B*H/2*W/2] int32 if keep_code, else [0]): one launch."""
    _check(images, weight, bias)
    images = images.contiguous()
    out = _empty_out(images, out_dtype, channels_last)
    code = _empty_code(images, keep_code)
    H, W = images.shape[2], images.shape[3]
    block = CODE_BLOCK if keep_code else BLOCK
    launch(_first_block_fwd_kernel, _grid(images, block), images, weight.contiguous(),
            bias.contiguous(), out, code, H, W, W // 2, (H // 2) * (W // 2), *out.stride(),
            BLOCK_=block, COMPUTE=tl_compute(weight), KEEP_CODE=keep_code,
            num_warps=NUM_WARPS)
    return out, code


@define_op("boxnet::first_block_backward", mutates_args=())
def first_block_backward(grad: torch.Tensor, images: torch.Tensor, weight: torch.Tensor,
                         bias: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dweight [4, 1, 3, 3], dL/dbias [4]) in the weight's dtype: one launch and one
    reduction."""
    images = images.contiguous()
    H, W = images.shape[2], images.shape[3]
    n_pooled, n_blocks, parts = walk_sums(images, weight, BWD_BLOCK, BWD_PROGRAMS)
    launch(_first_block_bwd_kernel, (parts.shape[0],), images, weight.contiguous(),
            bias.contiguous(), grad, parts, H, W, W // 2, n_pooled, n_blocks, *grad.stride(),
            BLOCK_=BWD_BLOCK, COMPUTE=tl_compute(weight), num_warps=NUM_WARPS)
    return grads_from_sums(parts)


def _setup_context(ctx, inputs, output):
    images, weight, bias, _, _, keep_code = inputs
    ctx.save_for_backward(images, weight, bias, output[1])
    ctx.keep_code = keep_code


def _backward(ctx, grad, grad_code):
    """From the kept code (first_block_bwd.py), or recomputing the conv from the image."""
    images, weight, bias, code = ctx.saved_tensors
    if ctx.keep_code:
        from kernels.trunk.first_block_bwd import first_block_code_backward
        d_weight, d_bias = first_block_code_backward(grad, images, code, weight)
    else:
        d_weight, d_bias = first_block_backward(grad, images, weight, bias)
    return None, d_weight, d_bias, None, None, None


first_block_op.register_autograd(_backward, setup_context=_setup_context)

if INTERPRETED:
    @first_block_op.register_fake
    def _(images, weight, bias, out_dtype, channels_last, keep_code=False):
        _check(images, weight, bias)
        return _empty_out(images, out_dtype, channels_last), _empty_code(images, keep_code)

    @first_block_backward.register_fake
    def _(grad, images, weight, bias):
        return weight.new_empty(weight.shape), bias.new_empty(bias.shape)


def first_block(images, weight, bias, out_dtype=torch.float32, channels_last=False,
                keep_code=False):
    """The block as BoxNet runs it with --triton-first-block (training/speedups/
    triton_first_block.py); keep_code: with --triton-first-block-code."""
    return first_block_op(images, weight, bias, out_dtype, channels_last, keep_code)[0]
