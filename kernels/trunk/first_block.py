"""BoxNet's first block in Triton: uint8 image -> /255 -> Conv2d(1->4, 3x3, padding 1) + bias
-> MaxPool2d(2) -> ReLU, forward and backward, each one kernel (`--triton-first-block`).

Why: cuDNN has no good kernel for a convolution with one input and four output channels:
its best choices take tens of times what the bytes below need (results/step.md), and pad
the one channel to more. A fused kernel also never writes the full-resolution conv
output: the pool and ReLU happen in registers.

Naming ladder: _first_block_fwd_kernel / _first_block_bwd_kernel (_persistent_sums
with _channel_sums) -> the custom ops boxnet::first_block and
boxnet::first_block_backward -> autograd -> first_block().
With keep_code (--triton-first-block-code) the forward also writes the pool's code and
the backward is kernels/trunk/first_block_bwd.py's, which reads it instead of
recomputing the conv.

Maths. x = img / 255; for output channel c and pooled pixel (i, j), the four conv values
of its 2x2 window are v[c, dy, dx] = sum_{ky, kx} w[c, ky, kx] * x[2i+dy+ky-1, 2j+dx+kx-1]
(zero outside the image); y[c, i, j] = relu(max_{dy,dx} v + bias[c]).
Gradient: with (dy*, dx*) the first maximum in PyTorch's scan order ((0,0), (0,1), (1,0),
(1,1); strictly greater wins, as max_pool2d's kernel), and g = dL/dy * [y > 0] (ReLU's
backward, as threshold_backward),
    dL/dw[c, ky, kx] = sum_{b,i,j} g[b, c, i, j] * x[b, 2i+dy*+ky-1, 2j+dx*+kx-1]
    dL/dbias[c]      = sum_{b,i,j} g[b, c, i, j].
The image gets no gradient (uint8). The backward recomputes v from the image rather than
saving argmax indices (1 byte per output read again instead of 1 written and read).
Computed in fp32 from fp32 weights (fp64 from fp64 ones, for gradcheck); the output is
stored in out_dtype (bf16 under the model's autocast).

Byte ledger at B=1024, S=256, bf16 output:
  forward:  reads B*S^2 = 67 MB of image, writes B*4*(S/2)^2*2 = 134 MB;
  backward: reads the image (67 MB) and dL/dy (134 MB), writes 40 fp32 partial sums per
            program (2.6 MB at BLOCK 1024), summed by one torch reduction.
About 0.07 ms each at ~3 TB/s; the compute (144 FMAs per pooled output per pass) is
~2.4 GFMA, ~0.1 ms on the CUDA cores.
"""

import torch
import triton
import triton.language as tl

from core.checks import check_conv_block
from core.errors import InputError
from kernels.triton_op import INTERPRETED, define_op, empty_4d, launch
from kernels.trunk.window import DEAD, first_max

CHANNELS = 4            # conv1's output channels: the kernels are written for this block
BLOCK = 1024            # pooled pixels per program of the forward
# ... when it keeps the code: at 1024 (8 pixels a thread) ptxas spilled (255 registers,
# 88-byte frame); at 256 it holds 93 and ran fastest compiled on the H100 (results/step.md).
CODE_BLOCK = 256
# The backward's programs each walk blocks of BWD_BLOCK pooled pixels, keeping 40 running
# sums per lane (2 pixels a thread at 4 warps: 80 registers of sums).
BWD_BLOCK = 256
BWD_PROGRAMS = 1056     # 8 per H100 SM
NUM_WARPS = 4
PARTIALS = CHANNELS * 10  # per program: 9 weight sums and 1 bias sum per channel


@triton.jit
def _px(img, r, c, H, W, mask, COMPUTE: tl.constexpr):
    """Image pixel (r, c) in [0, 1], 0 outside the image (the conv's padding)."""
    inside = mask & (r >= 0) & (r < H) & (c >= 0) & (c < W)
    return tl.load(img + r * W + c, mask=inside, other=0).to(COMPUTE) / 255.0


@triton.jit
def _conv9(w_ptr, c: tl.constexpr, a0, a1, a2, b0, b1, b2, d0, d1, d2):
    """sum_{ky,kx} w[c, ky, kx] * patch[ky][kx], the patch given row by row."""
    w = w_ptr + c * 9
    return (tl.load(w) * a0 + tl.load(w + 1) * a1 + tl.load(w + 2) * a2
            + tl.load(w + 3) * b0 + tl.load(w + 4) * b1 + tl.load(w + 5) * b2
            + tl.load(w + 6) * d0 + tl.load(w + 7) * d1 + tl.load(w + 8) * d2)


@triton.jit
def _patch(img_ptr, b, pid, H, W, W2, n_pooled, BLOCK_: tl.constexpr, COMPUTE: tl.constexpr):
    """The 4x4 pixels around each pooled output of the block: rows 2i-1..2i+2, columns
    2j-1..2j+2, as 16 vectors (row-major), plus the block's positions and mask."""
    offs = pid * BLOCK_ + tl.arange(0, BLOCK_)
    mask = offs < n_pooled
    i = offs // W2
    j = offs % W2
    img = img_ptr + b.to(tl.int64) * H * W
    r = 2 * i - 1
    c = 2 * j - 1
    return (offs, mask, i, j,
            _px(img, r, c, H, W, mask, COMPUTE),
            _px(img, r, c + 1, H, W, mask, COMPUTE),
            _px(img, r, c + 2, H, W, mask, COMPUTE),
            _px(img, r, c + 3, H, W, mask, COMPUTE),
            _px(img, r + 1, c, H, W, mask, COMPUTE),
            _px(img, r + 1, c + 1, H, W, mask, COMPUTE),
            _px(img, r + 1, c + 2, H, W, mask, COMPUTE),
            _px(img, r + 1, c + 3, H, W, mask, COMPUTE),
            _px(img, r + 2, c, H, W, mask, COMPUTE),
            _px(img, r + 2, c + 1, H, W, mask, COMPUTE),
            _px(img, r + 2, c + 2, H, W, mask, COMPUTE),
            _px(img, r + 2, c + 3, H, W, mask, COMPUTE),
            _px(img, r + 3, c, H, W, mask, COMPUTE),
            _px(img, r + 3, c + 1, H, W, mask, COMPUTE),
            _px(img, r + 3, c + 2, H, W, mask, COMPUTE),
            _px(img, r + 3, c + 3, H, W, mask, COMPUTE))


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
     x30, x31, x32, x33) = _patch(img_ptr, b, pid, H, W, W2, n_pooled, BLOCK_, COMPUTE)
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
    window's choice recomputed from the patch (`known` unused: _persistent_sums's
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
def _store_sums(part, c: tl.constexpr, s0, s1, s2, s3, s4, s5, s6, s7, s8, s9):
    tl.store(part + c * 10 + 0, tl.sum(s0, axis=0))
    tl.store(part + c * 10 + 1, tl.sum(s1, axis=0))
    tl.store(part + c * 10 + 2, tl.sum(s2, axis=0))
    tl.store(part + c * 10 + 3, tl.sum(s3, axis=0))
    tl.store(part + c * 10 + 4, tl.sum(s4, axis=0))
    tl.store(part + c * 10 + 5, tl.sum(s5, axis=0))
    tl.store(part + c * 10 + 6, tl.sum(s6, axis=0))
    tl.store(part + c * 10 + 7, tl.sum(s7, axis=0))
    tl.store(part + c * 10 + 8, tl.sum(s8, axis=0))
    tl.store(part + c * 10 + 9, tl.sum(s9, axis=0))


@triton.jit
def _persistent_sums(img_ptr, w_ptr, bias_ptr, code_ptr, grad_ptr, part_ptr, H, W, W2,
                     n_pooled, n_blocks, sgb, sgc, sgh, sgw, BLOCK_: tl.constexpr,
                     COMPUTE: tl.constexpr, CHANNEL: tl.constexpr,
                     FROM_CODE: tl.constexpr):
    """Both backward kernels' persistent walk: each program takes blocks pid, pid +
    programs, ... (over images and the blocks of each), adds CHANNEL's terms to its 40
    sums per lane, and reduces them once at its end (one reduction per block of 1024
    took 40 block-wide reductions each). CHANNEL recomputes each window's choice
    (_channel_sums) or reads it from the forward's code, loaded once a block where
    FROM_CODE (first_block_bwd.py); both are constexprs, so each kernel compiles only its
    own path."""
    pid = tl.program_id(0)
    per_image = tl.cdiv(n_pooled, BLOCK_)
    z = tl.zeros((BLOCK_,), dtype=COMPUTE)
    a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 = z, z, z, z, z, z, z, z, z, z
    b0, b1, b2, b3, b4, b5, b6, b7, b8, b9 = z, z, z, z, z, z, z, z, z, z
    c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 = z, z, z, z, z, z, z, z, z, z
    d0, d1, d2, d3, d4, d5, d6, d7, d8, d9 = z, z, z, z, z, z, z, z, z, z
    for blk in range(pid, n_blocks, tl.num_programs(0)):
        b = blk // per_image
        (offs, mask, i, j, x00, x01, x02, x03, x10, x11, x12, x13, x20, x21, x22, x23,
         x30, x31, x32, x33) = _patch(img_ptr, b, blk % per_image, H, W, W2, n_pooled,
                                      BLOCK_, COMPUTE)
        if FROM_CODE:
            known = tl.load(code_ptr + b.to(tl.int64) * n_pooled + offs, mask=mask, other=0)
        else:
            known = offs  # not read: the window's choice is recomputed
        grad = grad_ptr + b.to(tl.int64) * sgb + i * sgh + j * sgw
        a0, a1, a2, a3, a4, a5, a6, a7, a8, a9 = CHANNEL(
            w_ptr, bias_ptr, known, 0, grad, mask, sgc, a0, a1, a2, a3, a4, a5, a6, a7, a8,
            a9, x00, x01, x02, x03, x10, x11, x12, x13, x20, x21, x22, x23, x30, x31, x32,
            x33, COMPUTE)
        b0, b1, b2, b3, b4, b5, b6, b7, b8, b9 = CHANNEL(
            w_ptr, bias_ptr, known, 1, grad, mask, sgc, b0, b1, b2, b3, b4, b5, b6, b7, b8,
            b9, x00, x01, x02, x03, x10, x11, x12, x13, x20, x21, x22, x23, x30, x31, x32,
            x33, COMPUTE)
        c0, c1, c2, c3, c4, c5, c6, c7, c8, c9 = CHANNEL(
            w_ptr, bias_ptr, known, 2, grad, mask, sgc, c0, c1, c2, c3, c4, c5, c6, c7, c8,
            c9, x00, x01, x02, x03, x10, x11, x12, x13, x20, x21, x22, x23, x30, x31, x32,
            x33, COMPUTE)
        d0, d1, d2, d3, d4, d5, d6, d7, d8, d9 = CHANNEL(
            w_ptr, bias_ptr, known, 3, grad, mask, sgc, d0, d1, d2, d3, d4, d5, d6, d7, d8,
            d9, x00, x01, x02, x03, x10, x11, x12, x13, x20, x21, x22, x23, x30, x31, x32,
            x33, COMPUTE)
    part = part_ptr + pid.to(tl.int64) * 40
    _store_sums(part, 0, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9)
    _store_sums(part, 1, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9)
    _store_sums(part, 2, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9)
    _store_sums(part, 3, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9)


@triton.jit
def _first_block_bwd_kernel(img_ptr, w_ptr, bias_ptr, grad_ptr, part_ptr, H, W, W2,
                            n_pooled, n_blocks, sgb, sgc, sgh, sgw, BLOCK_: tl.constexpr,
                            COMPUTE: tl.constexpr):
    """The walk, each window's choice recomputed from the image (no code: img_ptr stands
    in for the code's pointer, never read)."""
    _persistent_sums(img_ptr, w_ptr, bias_ptr, img_ptr, grad_ptr, part_ptr, H, W, W2,
                     n_pooled, n_blocks, sgb, sgc, sgh, sgw, BLOCK_, COMPUTE,
                     _channel_sums, False)


def _check(images: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> None:
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] != 1:
        raise InputError(f"first_block takes uint8 images [B, 1, H, W], got "
                         f"{images.dtype} {tuple(images.shape)}")
    check_conv_block("first_block", images, weight, bias, 1, CHANNELS)


def _tl_compute(weight):
    """fp32 maths for fp32 weights (the model's master weights), fp64 for fp64 (gradcheck)."""
    return tl.float64 if weight.dtype == torch.float64 else tl.float32


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
            BLOCK_=block, COMPUTE=_tl_compute(weight), KEEP_CODE=keep_code,
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
            BLOCK_=BWD_BLOCK, COMPUTE=_tl_compute(weight), num_warps=NUM_WARPS)
    return grads_from_sums(parts)


def walk_sums(images, weight, block, most):
    """What a persistent backward walks and writes (this one, and first_block_bwd.py's):
    an image's pooled pixels, the blocks of `block` of them over the batch, and the
    partial sums [programs, 40] of at most `most` programs, in the weight's dtype."""
    B, _, H, W = images.shape
    n_pooled = (H // 2) * (W // 2)
    n_blocks = B * triton.cdiv(n_pooled, block)
    parts = torch.empty((min(n_blocks, most), PARTIALS), dtype=weight.dtype,
                        device=images.device)
    return n_pooled, n_blocks, parts


def grads_from_sums(parts):
    """(dL/dweight [4, 1, 3, 3], dL/dbias [4]) from the programs' partial sums: each
    channel's nine taps, then its bias (_store_sums's order)."""
    sums = parts.sum(0).view(CHANNELS, 10)
    return sums[:, :9].reshape(CHANNELS, 1, 3, 3).contiguous(), sums[:, 9].contiguous()


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
