"""What the Triton conv blocks share about a 2x2 max-pool window (first_block.py,
second_block.py, conv_pool.py and its backward, conv_pool_bwd.py): the pool code of a
window whose ReLU passes no gradient (DEAD), and the select of a gradient by its code."""

import triton
import triton.language as tl

from kernels.rounding import INTERPRETED

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
def divmod_nonneg(p, d):
    """(p // d, p % d) for int32 p >= 0 and d > 0, divided unsigned: the signed division
    takes each operand's absolute value and fixes the quotient's sign after (IABS, LOP3,
    ISETP, a negation), a dozen instructions an element where the sizes are not constexprs."""
    u = p.to(tl.uint32)
    v = tl.cast(d, tl.uint32)
    return (u // v).to(tl.int32), (u % v).to(tl.int32)


@triton.jit
def flat_bij(p, H2, W2):
    """(b (int64), i, j) of flat pooled indices p >= 0 over (b, i, j), unsigned as
    divmod_nonneg (b from p itself, not from p // W2: fewer instructions in the second
    block's weight gradient, whose loop needs b in three layouts)."""
    u = p.to(tl.uint32)
    w2 = tl.cast(W2, tl.uint32)
    h2 = tl.cast(H2, tl.uint32)
    return (u // (w2 * h2)).to(tl.int64), ((u // w2) % h2).to(tl.int32), (u % w2).to(tl.int32)


@triton.jit
def pooled_pixels(blk, n_pooled, H2, W2, BLOCK: tl.constexpr):
    """Block blk's pooled pixels, flat over (b, i, j): the flat index, b (int64), i, j,
    and the mask of those that exist."""
    p = blk * BLOCK + tl.arange(0, BLOCK)
    b, i, j = flat_bij(p, H2, W2)
    return p, b, i, j, p < n_pooled


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


def eq_asm(d: int) -> str:
    """PTX for four bf16 g (two words, $2 $3) and their four int8 codes (one word, $4): g
    where code == d, else 0. Byte k of t = code_k ^ d is 0 where equal and at most 7 else
    (codes 0-4), so adding 0x7F sets its top bit only where not equal, with no carry into
    the next byte; the top bits inverted, prmt's sign-replicating selectors (8-B) spread
    bytes 0-1 and 2-3 into halfword masks for the two words."""
    return ("{ .reg .b32 t, m; "
            f"xor.b32 t, $4, {0x01010101 * d:#010x}; add.u32 t, t, 0x7F7F7F7F; "
            "and.b32 t, t, 0x80808080; xor.b32 t, t, 0x80808080; "
            "prmt.b32 m, t, 0, 0x9988; and.b32 $0, $2, m; "
            "prmt.b32 m, t, 0, 0xBBAA; and.b32 $1, $3, m; }")  # one line: Inductor copies it


_EQ_ASM_0, _EQ_ASM_1, _EQ_ASM_2, _EQ_ASM_3 = (tl.constexpr(eq_asm(d)) for d in range(4))


@triton.jit
def where_code(g, code, d: tl.constexpr, DOT: tl.constexpr):
    """g where code == d, else 0 (g and code 2-D, [rows, channels]): in bf16 compiled, four
    elements an instance by eq_asm's masks, in place of a compare, a select and the
    halves' repacking each."""
    if DOT == tl.bfloat16 and not INTERPRETED:
        if d == 0:
            asm: tl.constexpr = _EQ_ASM_0
        elif d == 1:
            asm: tl.constexpr = _EQ_ASM_1
        elif d == 2:
            asm: tl.constexpr = _EQ_ASM_2
        else:
            asm: tl.constexpr = _EQ_ASM_3
        # The asm reads only g and code. Without anchor (an operand it ignores, built from
        # the block's rows) Triton put the asm in another layout than g's, with a
        # conversion through shared memory around it: 648 more SASS instructions in the
        # third block's input gradient, 160 in the second's.
        rows = tl.arange(0, g.shape[0]) + tl.program_id(0)
        anchor = tl.where(rows >= 0, 0, 1)[:, None] + tl.zeros(g.shape, tl.int32)
        return tl.inline_asm_elementwise(asm, "=r,=r,r,r,r,r,r,r,r", [g, code, anchor],
                                         dtype=g.dtype, is_pure=True, pack=4)
    else:
        return tl.where(code == d, g, 0).to(DOT)
