"""BoxNet's first block's weight and bias gradients from the pool's code
(`--triton-first-block-code`, after --triton-first-block).

Why: the forward knows which window position won; kept (67 MB at batch 1024), the
backward recomputes no conv: ~180 instructions a pooled pixel instead of ~440.

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import triton
import triton.language as tl

from kernels.triton_op import INTERPRETED, define_op, launch
from kernels.trunk.first_block_walk import (
    CHANNELS,
    grads_from_sums,
    persistent_sums,
    tl_compute,
    walk_sums,
)

# Launch shape: blocks of 256 pooled pixels (two a thread: 80 sums of registers, 168 in
# all), 4 warps, 528 persistent programs (4 per H100 SM), each walking blocks pid,
# pid + PROGRAMS, ...: the fastest of nine shapes (128 or 256 pixels, 4 or 8 warps,
# 528-2112 programs) compiled on the H100, within 15 % of each other (results/step.md).
BLOCK = 256
NUM_WARPS = 4
PROGRAMS = 528


@triton.jit
def _code_channel_sums(w_ptr, bias_ptr, packed, c: tl.constexpr, grad, mask, sgc, s0, s1,
                       s2, s3, s4, s5, s6, s7, s8, s9, x00, x01, x02, x03, x10, x11, x12,
                       x13, x20, x21, x22, x23, x30, x31, x32, x33, COMPUTE: tl.constexpr):
    """Channel c's ten running sums plus this block's terms, from its code (byte c of
    packed; the weight and bias unused: first_block_walk.py's persistent_sums's
    CHANNEL)."""
    d = (packed >> (8 * c)) & 0xFF
    g = tl.load(grad + c * sgc, mask=mask, other=0).to(COMPUTE)
    g = tl.where((d < 4) & mask, g, 0.0)
    down = d >= 2
    right = (d & 1) == 1
    a0, a1, a2, a3 = (tl.where(down, x10, x00), tl.where(down, x11, x01),
                      tl.where(down, x12, x02), tl.where(down, x13, x03))
    b0, b1, b2, b3 = (tl.where(down, x20, x10), tl.where(down, x21, x11),
                      tl.where(down, x22, x12), tl.where(down, x23, x13))
    e0, e1, e2, e3 = (tl.where(down, x30, x20), tl.where(down, x31, x21),
                      tl.where(down, x32, x22), tl.where(down, x33, x23))
    return (s0 + g * tl.where(right, a1, a0), s1 + g * tl.where(right, a2, a1),
            s2 + g * tl.where(right, a3, a2), s3 + g * tl.where(right, b1, b0),
            s4 + g * tl.where(right, b2, b1), s5 + g * tl.where(right, b3, b2),
            s6 + g * tl.where(right, e1, e0), s7 + g * tl.where(right, e2, e1),
            s8 + g * tl.where(right, e3, e2), s9 + g)


@triton.jit
def _first_block_code_bwd_kernel(img_ptr, code_ptr, grad_ptr, part_ptr, H, W, W2,
                                 n_pooled, n_blocks, sgb, sgc, sgh, sgw,
                                 BLOCK_: tl.constexpr, COMPUTE: tl.constexpr):
    """first_block.py's persistent walk, each window's choice read from the code (no
    weight or bias needed: img_ptr stands in for their pointers, never read)."""
    persistent_sums(img_ptr, img_ptr, img_ptr, code_ptr, grad_ptr, part_ptr, H, W, W2,
                     n_pooled, n_blocks, sgb, sgc, sgh, sgw, BLOCK_, COMPUTE,
                     _code_channel_sums, True)


@define_op("boxnet::first_block_code_backward", mutates_args=())
def first_block_code_backward(grad: torch.Tensor, images: torch.Tensor, code: torch.Tensor,
                              weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dL/dweight [4, 1, 3, 3], dL/dbias [4]) in the weight's dtype from the pooled
    gradient [B, 4, H/2, W/2] and the forward's code: one launch and one reduction."""
    images = images.contiguous()
    H, W = images.shape[2], images.shape[3]
    n_pooled, n_blocks, parts = walk_sums(images, weight, BLOCK, PROGRAMS)
    launch(_first_block_code_bwd_kernel, (parts.shape[0],), images, code, grad, parts, H, W,
           W // 2, n_pooled, n_blocks, *grad.stride(), BLOCK_=BLOCK,
           COMPUTE=tl_compute(weight), num_warps=NUM_WARPS)
    return grads_from_sums(parts)


if INTERPRETED:
    @first_block_code_backward.register_fake
    def _(grad, images, code, weight):
        return weight.new_empty((CHANNELS, 1, 3, 3)), weight.new_empty((CHANNELS,))
