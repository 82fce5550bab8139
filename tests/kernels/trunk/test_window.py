"""kernels/trunk/window's unsigned division (divmod_nonneg, flat_bij): Python's divmod for
every non-negative int32 index, at divisors of 1 (a constexpr on the GPU, where Triton
specialises an argument of 1) up to an image of 2**31 pooled pixels."""

import random

import pytest
import torch
import triton
import triton.language as tl

from kernels.trunk.window import divmod_nonneg, flat_bij

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (H2, W2): ones, a prime width, a tall image, the model's, and H2 * W2 just under 2**31.
SIZES = [(1, 1), (1, 7), (5, 1), (64, 64), (3, 1000), (46341, 46340)]
INT32_MAX = 2**31 - 1


@triton.jit
def _bij_kernel(p_ptr, out_ptr, n, H2, W2, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    p = tl.load(p_ptr + offs, mask=mask, other=0)
    b, i, j = flat_bij(p, H2, W2)
    q, r = divmod_nonneg(p, W2)
    row = out_ptr + offs.to(tl.int64) * 5
    tl.store(row, b, mask=mask)
    tl.store(row + 1, i.to(tl.int64), mask=mask)
    tl.store(row + 2, j.to(tl.int64), mask=mask)
    tl.store(row + 3, q.to(tl.int64), mask=mask)
    tl.store(row + 4, r.to(tl.int64), mask=mask)


def _indices(h2: int, w2: int, rng: random.Random) -> list[int]:
    """Fresh random indices over the whole int32 range and under one image, and the
    edges: 0, each side of a row's and an image's end, the largest int32."""
    edges = [0, 1, w2 - 1, w2, w2 + 1, h2 * w2 - 1, h2 * w2, h2 * w2 + 1, INT32_MAX - 1,
             INT32_MAX]
    spread = [rng.randrange(INT32_MAX + 1) for _ in range(300)]
    near = [rng.randrange(min(4 * h2 * w2, INT32_MAX)) for _ in range(300)]
    return [p for p in edges + spread + near if 0 <= p <= INT32_MAX]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("h2, w2", SIZES)
def test_flat_bij_is_pythons_divmod(device, h2, w2):
    p = _indices(h2, w2, random.Random())
    out = torch.empty((len(p), 5), dtype=torch.int64, device=device)
    _bij_kernel[(triton.cdiv(len(p), 128),)](torch.tensor(p, dtype=torch.int32,
                                                          device=device),
                                             out, len(p), h2, w2, BLOCK=128)
    want = [[v // (h2 * w2), v // w2 % h2, v % w2, v // w2, v % w2] for v in p]
    assert out.cpu().tolist() == want
