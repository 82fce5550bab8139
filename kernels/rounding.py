"""Rounding inside a Triton kernel as the GPU rounds it, also under Triton's interpreter
(the CPU tests), which truncates a cast to bf16 where the GPU rounds to nearest, ties to
even: the kernels that must match torch's roundings bit for bit round by hand.

    TL_DTYPE[x.dtype]       the Triton dtype of a torch floating dtype (a kernel's ROUND)
    round_to(v, ROUND)      fp32 v rounded to ROUND, held in fp32 (trunk/)
    bf16_rtne(x)            fp32 x as a bf16 value (lin1/)
"""

import torch
import triton
import triton.language as tl

TL_DTYPE = {torch.float64: tl.float64, torch.float32: tl.float32,
            torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
# What the trunk's pool kernels take: the model's dtypes (fp64 is the second block's, for
# gradcheck, alone).
POOL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


@triton.jit
def round_to(v, ROUND: tl.constexpr):
    """fp32 v rounded to ROUND (to nearest, ties to even), held in fp32. bf16 is rounded
    by hand (NaN stays NaN): the interpreter truncates a cast to bf16, where the GPU
    rounds."""
    if ROUND == tl.bfloat16:
        u = v.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return tl.where(v != v, v, u.to(tl.float32, bitcast=True))
    else:
        return v.to(ROUND).to(tl.float32)


@triton.jit
def bf16_rtne(x):
    """fp32 -> bf16 rounded to nearest, ties to even (as torch's .bfloat16()), in integer
    arithmetic: the interpreter truncates in .to(tl.bfloat16), so the CPU tests would
    check another rounding than the GPU runs. NaN stays NaN, inf stays inf."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + (((bits >> 16) & 1) + 0x7FFF)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
