"""What the Triton conv blocks share about a 2x2 max-pool window (kernels/
triton_first_block.py, triton_second_block.py)."""

import triton
import triton.language as tl


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
