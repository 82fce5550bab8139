"""What BoxNet's first block's kernels share (kernels/trunk/first_block.py's forward and
backward, first_block_bwd.py's backward from the pool's code): the 4x4 patch of pixels
around each pooled output, and the backward's persistent walk with its partial sums.
Its own module so that both backward files import it and neither imports the other
(first_block.py calls first_block_bwd.py's op; nothing calls back up).
"""

import torch
import triton
import triton.language as tl

from kernels.trunk.window import divmod_nonneg

CHANNELS = 4            # conv1's output channels: the kernels are written for this block
PARTIALS = CHANNELS * 10  # per program: 9 weight sums and 1 bias sum per channel


@triton.jit
def px(img, r, c, H, W, mask, COMPUTE: tl.constexpr):
    """Image pixel (r, c) in [0, 1], 0 outside the image (the conv's padding)."""
    inside = mask & (r >= 0) & (r < H) & (c >= 0) & (c < W)
    return tl.load(img + r * W + c, mask=inside, other=0).to(COMPUTE) / 255.0


@triton.jit
def patch(img_ptr, b, pid, H, W, W2, n_pooled, BLOCK_: tl.constexpr, COMPUTE: tl.constexpr):
    """The 4x4 pixels around each pooled output of the block: rows 2i-1..2i+2, columns
    2j-1..2j+2, as 16 vectors (row-major), plus the block's positions and mask."""
    offs = pid * BLOCK_ + tl.arange(0, BLOCK_)
    mask = offs < n_pooled
    i, j = divmod_nonneg(offs, W2)
    img = img_ptr + b.to(tl.int64) * H * W
    r = 2 * i - 1
    c = 2 * j - 1
    return (offs, mask, i, j,
            px(img, r, c, H, W, mask, COMPUTE),
            px(img, r, c + 1, H, W, mask, COMPUTE),
            px(img, r, c + 2, H, W, mask, COMPUTE),
            px(img, r, c + 3, H, W, mask, COMPUTE),
            px(img, r + 1, c, H, W, mask, COMPUTE),
            px(img, r + 1, c + 1, H, W, mask, COMPUTE),
            px(img, r + 1, c + 2, H, W, mask, COMPUTE),
            px(img, r + 1, c + 3, H, W, mask, COMPUTE),
            px(img, r + 2, c, H, W, mask, COMPUTE),
            px(img, r + 2, c + 1, H, W, mask, COMPUTE),
            px(img, r + 2, c + 2, H, W, mask, COMPUTE),
            px(img, r + 2, c + 3, H, W, mask, COMPUTE),
            px(img, r + 3, c, H, W, mask, COMPUTE),
            px(img, r + 3, c + 1, H, W, mask, COMPUTE),
            px(img, r + 3, c + 2, H, W, mask, COMPUTE),
            px(img, r + 3, c + 3, H, W, mask, COMPUTE))


@triton.jit
def store_sums(part, c: tl.constexpr, s0, s1, s2, s3, s4, s5, s6, s7, s8, s9):
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
def persistent_sums(img_ptr, w_ptr, bias_ptr, code_ptr, grad_ptr, part_ptr, H, W, W2,
                     n_pooled, n_blocks, sgb, sgc, sgh, sgw, BLOCK_: tl.constexpr,
                     COMPUTE: tl.constexpr, CHANNEL: tl.constexpr,
                     FROM_CODE: tl.constexpr):
    """Both backward kernels' persistent walk: each program takes blocks pid, pid +
    programs, ... (over images and the blocks of each), adds CHANNEL's terms to its 40
    sums per lane, and reduces them once at its end (one reduction per block of 1024
    took 40 block-wide reductions each). CHANNEL recomputes each window's choice
    (first_block.py's _channel_sums) or reads it from the forward's code, loaded once a block where
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
         x30, x31, x32, x33) = patch(img_ptr, b, blk % per_image, H, W, W2, n_pooled,
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
    store_sums(part, 0, a0, a1, a2, a3, a4, a5, a6, a7, a8, a9)
    store_sums(part, 1, b0, b1, b2, b3, b4, b5, b6, b7, b8, b9)
    store_sums(part, 2, c0, c1, c2, c3, c4, c5, c6, c7, c8, c9)
    store_sums(part, 3, d0, d1, d2, d3, d4, d5, d6, d7, d8, d9)


def tl_compute(weight):
    """fp32 maths for fp32 weights (the model's master weights), fp64 for fp64 (gradcheck)."""
    return tl.float64 if weight.dtype == torch.float64 else tl.float32


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
