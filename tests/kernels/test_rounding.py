"""kernels/rounding's round_to (by hand) and round_to_cvt (by the hardware's conversion where
compiled, by hand under the interpreter, whose cast truncates): torch's rounding bit for
bit; a NaN stays NaN, in bf16 with its own bits."""

import pytest
import torch
import triton
import triton.language as tl

from kernels.rounding import INTERPRETED, TL_DTYPE, round_to, round_to_cvt
from tests.helpers import floats_of_bits

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# Ties rounded down (even) and up (odd), both signs; a rounding up across a binade and up
# to inf; the largest finite bf16; zeros; subnormals, one a tie; infinities; two NaNs, one
# with a payload that a canonical NaN would lose.
EDGES = [0x3F808000, 0xBF808000, 0x3F818000, 0xBF818000, 0x3F7FFFFF, 0x7F7FFFFF,
         0x7F7F7FFF, 0x00000000, 0x80000000, 0x00000001, 0x00008000, 0x00018000,
         0x7F800000, 0xFF800000, 0x7FC00000, 0x7F800001]


@triton.jit
def _round_kernel(x_ptr, out_ptr, n, ROUND: tl.constexpr, CVT: tl.constexpr,
                  BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    v = tl.load(x_ptr + offs, mask=mask)
    if CVT:
        tl.store(out_ptr + offs, round_to_cvt(v, ROUND), mask=mask)
    else:
        tl.store(out_ptr + offs, round_to(v, ROUND), mask=mask)


def _rounded(x: torch.Tensor, dtype: torch.dtype, cvt: bool) -> torch.Tensor:
    out = torch.empty_like(x)
    _round_kernel[(triton.cdiv(x.numel(), 256),)](x, out, x.numel(), ROUND=TL_DTYPE[dtype],
                                                  CVT=cvt, BLOCK=256)
    return out


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("cvt", [False, True], ids=["round_to", "round_to_cvt"])
def test_rounding_is_torchs_bit_for_bit(device, dtype, cvt):
    """Fresh random values over 40 decades, then the edges: each the bits of torch's
    rounding held in fp32; a NaN a NaN, in bf16 its own bits."""
    n = 3000
    values = torch.randn(n) * torch.logspace(-20, 20, n)[torch.randperm(n)]
    x = torch.cat([values, floats_of_bits(EDGES)]).to(device)
    got = _rounded(x, dtype, cvt)
    nan = x.isnan()
    assert torch.equal(got.isnan(), nan)
    want = x.to(dtype).float()
    assert torch.equal(got[~nan].view(torch.int32), want[~nan].view(torch.int32))
    if dtype == torch.bfloat16:
        assert torch.equal(got[nan].view(torch.int32), x[nan].view(torch.int32))


def test_round_to_cvt_rounds_by_hand_exactly_where_kernels_are_interpreted():
    """The constant that picks the hand rounding agrees with what triton.jit made."""
    from triton.runtime.interpreter import InterpretedFunction
    assert INTERPRETED == isinstance(round_to_cvt, InterpretedFunction)
