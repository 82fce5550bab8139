"""Rounding inside a Triton kernel as the GPU rounds it, also under Triton's interpreter
(the CPU tests), which truncates a cast to bf16 where the GPU rounds to nearest, ties to
even: the kernels that must match torch's roundings bit for bit round by hand under the
interpreter, and where compiled by hand or by the conversion instruction, whichever the
kernel's bound favours (results/trunk.md).

    TL_DTYPE[x.dtype]       the Triton dtype of a torch floating dtype (a kernel's ROUND)
    round_to(v, ROUND)      fp32 v rounded to ROUND, held in fp32 (trunk/pool)
    round_to_cvt(v, ROUND)  the same, by the conversion where compiled (trunk/conv_pool*)
    bf16_rtne(x)            fp32 x as a bf16 value (lin1/)
"""

import torch
import triton
import triton.language as tl

from kernels import triton_op

TL_DTYPE = {torch.float64: tl.float64, torch.float32: tl.float32,
            torch.bfloat16: tl.bfloat16, torch.float16: tl.float16}
# What the trunk's pool kernels take: the model's dtypes (fp64 is the second block's, for
# gradcheck, alone).
POOL_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


# Whether this process's kernels run in the interpreter: a constant of every kernel that
# calls round_to_cvt, so Triton's cache and Inductor's copy of the kernel both key on it.
INTERPRETED = tl.constexpr(triton_op.INTERPRETED)


@triton.jit
def round_to(v, ROUND: tl.constexpr):
    """fp32 v rounded to ROUND (to nearest, ties to even), held in fp32; a NaN stays NaN
    (in bf16 with its bits). bf16 by hand, in integer adds, shifts and masks: what the
    interpreter needs, and where compiled the faster of the two in the pool's forward."""
    if ROUND == tl.bfloat16:
        u = v.to(tl.uint32, bitcast=True)
        u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
        return tl.where(v != v, v, u.to(tl.float32, bitcast=True))
    else:
        return v.to(ROUND).to(tl.float32)


@triton.jit
def round_to_cvt(v, ROUND: tl.constexpr):
    """round_to by the hardware's conversion where compiled (the same bits; one F2F where
    the hand rounding takes several integer instructions): the faster of the two in the
    third block's kernels. By hand under the interpreter, which truncates the cast."""
    if ROUND == tl.bfloat16 and not INTERPRETED:
        return tl.where(v != v, v, v.to(tl.bfloat16).to(tl.float32))
    else:
        return round_to(v, ROUND)


@triton.jit
def bf16_rtne(x):
    """fp32 -> bf16 rounded to nearest, ties to even (as torch's .bfloat16()), in integer
    arithmetic: the interpreter truncates in .to(tl.bfloat16), so the CPU tests would
    check another rounding than the GPU runs. NaN stays NaN, inf stays inf."""
    bits = x.to(tl.uint32, bitcast=True)
    bits = bits + (((bits >> 16) & 1) + 0x7FFF)
    return (bits >> 16).to(tl.uint16).to(tl.bfloat16, bitcast=True)
