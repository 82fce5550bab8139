"""What the Triton conv blocks share about a 2x2 max-pool window (first_block.py,
second_block.py, conv_pool.py and its backward, conv_pool_bwd.py), and the pool code of a
window whose ReLU passes no gradient (DEAD)."""

import triton
import triton.language as tl

DEAD = tl.constexpr(4)  # the code of a pooled value whose ReLU passes no gradient


@triton.jit
def first_max(v0, v1, v2, v3):
    """(d*, max) of a window's four values given in max_pool2d's scan order ((0,0), (0,1),
    (1,0), (1,1)): the first maximum, strictly greater replacing, as max_pool2d's kernel."""
    m = v0
    sel = tl.zeros(v0.shape, dtype=tl.int32)
    sel = tl.where(v1 > m, 1, sel)
    m = tl.maximum(m, v1)
    sel = tl.where(v2 > m, 2, sel)
    m = tl.maximum(m, v2)
    sel = tl.where(v3 > m, 3, sel)
    m = tl.maximum(m, v3)
    return sel, m


@triton.jit
def pooled_pixels(blk, n_pooled, H2, W2, BLOCK: tl.constexpr):
    """Block blk's pooled pixels, flat over (b, i, j): the flat index, b (int64), i, j,
    and the mask of those that exist."""
    p = blk * BLOCK + tl.arange(0, BLOCK)
    mask = p < n_pooled
    return p, (p // (H2 * W2)).to(tl.int64), (p // W2) % H2, p % W2, mask


@triton.jit
def patch_row(x_ptr, b, i, j, mask, pr: tl.constexpr, shift: tl.constexpr, H, W, sxb,
              sxc, sxh, sxw, CI: tl.constexpr, DOT: tl.constexpr):
    """Row pr of pooled pixel (i, j)'s 4x4 input patch, moved shift columns right:
    [BLOCK, 4*CI] with x[b, ci, 2i-1+pr, 2j-1+shift+px] at column px*CI + ci (under
    channels_last the row's 4*CI numbers are contiguous), 0 outside the image, held in
    DOT (x's dtype on a GPU; fp32 under the interpreter, whose dot takes no bf16 or
    fp16)."""
    k = tl.arange(0, 4 * CI)
    r = 2 * i - 1 + pr
    c = 2 * j[:, None] - 1 + shift + (k // CI)[None, :]
    inside = (mask & (r >= 0) & (r < H))[:, None] & (c >= 0) & (c < W)
    ptrs = x_ptr + (b * sxb + r * sxh)[:, None] + c * sxw + (k % CI)[None, :] * sxc
    return tl.load(ptrs, mask=inside, other=0).to(DOT)
