"""lin1's bf16 weight cast to float8 (e4m3) for `--float8-lin1`'s GEMMs, in both layouts
the Hopper float8 GEMM takes, by one Triton kernel: at the build. After each update the
shadow SGD's own kernel writes the [out, in] copy (kernels/lin1/shadow_sgd.py, FLOAT8)
and `transpose` here makes [in, out] from it; `roll` moves the delayed scale before either.

Why: torch._scaled_mm wants both operands K-major, so the weight is needed in both
layouts; one kernel reads the bf16 weight once (2.15 GB) and writes both copies (1.07 GB
each), where an eager cast makes a pass for each.

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import triton
import triton.language as tl

from core.errors import InputError

E4M3_MAX = 448.0
BLOCK_ROWS = 64
BLOCK_COLS = 128
NUM_WARPS = 4
SLOTS = 64  # where the tiles' amaxes meet: tile k's in slot k % SLOTS


@triton.jit
def e4m3_rtne(v):
    """fp32 v in [-448, 448] rounded to the nearest e4m3 value, ties to even, held in
    fp32. Normal values (2^-6 and up) keep 3 of fp32's 23 mantissa bits (rounded at bit
    20); below 2^-6 the values are multiples of 2^-9, rounded by adding and taking away
    2^14, whose fp32 ulp is 2^-9 (the add rounds to nearest even)."""
    a = tl.abs(v)
    bits = a.to(tl.uint32, bitcast=True)
    normal = ((bits + 0x7FFFF + ((bits >> 20) & 1)) & 0xFFF00000).to(tl.float32,
                                                                       bitcast=True)
    small = (a + 16384.0) - 16384.0
    r = tl.where(a < 0.015625, small, normal).to(tl.uint32, bitcast=True)
    sign = v.to(tl.uint32, bitcast=True) & 0x80000000  # -0.0 stays -0.0
    return (r | sign).to(tl.float32, bitcast=True)


SCALE, AMAX_LAST, AMAX_NOW = range(3)  # the state's elements (AMAX_NOW: the first slot)


@triton.jit
def _roll_kernel(state_ptr, inverse_ptr, E4M3_MAX_: tl.constexpr, SLOTS_: tl.constexpr):
    """The last cast's amax becomes the one this cast scales by; this cast's starts at 0."""
    slots = state_ptr + 2 + tl.arange(0, SLOTS_)
    amax = tl.max(tl.load(slots), axis=0)
    scale = tl.where(amax > 0, E4M3_MAX_ / amax, 1.0)
    tl.store(state_ptr, scale)
    tl.store(state_ptr + 1, amax)
    tl.store(slots, tl.zeros([SLOTS_], dtype=tl.float32))
    tl.store(inverse_ptr, 1.0 / scale)


@triton.jit
def _cast_kernel(w_ptr, w8_ptr, w8t_ptr, state_ptr, rows, cols, E4M3_MAX_: tl.constexpr,
                 SLOTS_: tl.constexpr, BR: tl.constexpr, BC: tl.constexpr):
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)[:, None]
    c = tl.program_id(1).to(tl.int64) * BC + tl.arange(0, BC)[None, :]
    mask = (r < rows) & (c < cols)
    w = tl.load(w_ptr + r * cols + c, mask=mask, other=0).to(tl.float32)
    scaled = tl.minimum(tl.maximum(w * tl.load(state_ptr), -E4M3_MAX_), E4M3_MAX_)
    q = e4m3_rtne(scaled).to(tl.float8e4nv)
    tl.store(w8_ptr + r * cols + c, q, mask=mask)
    tl.store(w8t_ptr + c * rows + r, q, mask=mask)
    slot = (tl.program_id(0) * tl.num_programs(1) + tl.program_id(1)) % SLOTS_
    # |w| >= 0: a max is exact; relaxed, as the update's (kernels/lin1/shadow_sgd.py).
    tl.atomic_max(state_ptr + 2 + slot, tl.max(tl.abs(w)), sem="relaxed")


@triton.jit
def _transpose_kernel(w8_ptr, w8t_ptr, rows, cols, BR: tl.constexpr, BC: tl.constexpr):
    """The e4m3 copy [rows, cols] -> its transpose, as bytes (uint8 views)."""
    r = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)[:, None]
    c = tl.program_id(1).to(tl.int64) * BC + tl.arange(0, BC)[None, :]
    mask = (r < rows) & (c < cols)
    tl.store(w8t_ptr + c * rows + r, tl.load(w8_ptr + r * cols + c, mask=mask), mask=mask)


def new_state(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(state, inverse) before the first cast: its amax to scale by is the weight's own
    (read on the device, no sync)."""
    state = torch.zeros(2 + SLOTS, dtype=torch.float32, device=weight.device)
    state[AMAX_NOW] = weight.detach().abs().amax().float()
    return state, torch.ones((), dtype=torch.float32, device=weight.device)


def check_copies(w8: torch.Tensor, w8t: torch.Tensor, rows: int, cols: int) -> None:
    if (w8.shape, w8t.shape) != ((rows, cols), (cols, rows)) or {
            w8.dtype, w8t.dtype} != {torch.float8_e4m3fn} or not (
            w8.is_contiguous() and w8t.is_contiguous()):
        raise InputError("the float8 copies are contiguous float8_e4m3fn [out, in] and "
                         "[in, out]")


def check_state(state: torch.Tensor, inverse: torch.Tensor) -> None:
    if (state.shape, inverse.shape) != ((2 + SLOTS,), ()) or {
            state.dtype, inverse.dtype} != {torch.float32}:
        raise InputError(f"the float8 cast's state is fp32 [{2 + SLOTS}] and its inverse "
                         "fp32 0-dim")


def cast_weight(weight: torch.Tensor, w8: torch.Tensor, w8t: torch.Tensor,
                state: torch.Tensor, inverse: torch.Tensor) -> None:
    """weight [out, in] (bf16) -> w8 [out, in] and w8t [in, out] (float8_e4m3fn), in place,
    scaled by the state's delayed scale, whose inverse goes to `inverse`; two launches on
    the current stream, no sync."""
    rows, cols = weight.shape
    if weight.dtype != torch.bfloat16 or not weight.is_contiguous():
        raise InputError("the float8 cast takes lin1's contiguous bf16 weight")
    check_copies(w8, w8t, rows, cols)
    check_state(state, inverse)
    if len({t.device for t in (weight, w8, w8t, state, inverse)}) != 1:
        raise InputError("the float8 cast's tensors must be on one device")
    roll(state, inverse)
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS))
    _cast_kernel[grid](weight, w8, w8t, state, rows, cols, E4M3_MAX_=E4M3_MAX, SLOTS_=SLOTS,
                       BR=BLOCK_ROWS, BC=BLOCK_COLS, num_warps=NUM_WARPS)


def roll(state: torch.Tensor, inverse: torch.Tensor) -> None:
    """Before a cast: the last cast's amax becomes the scale's, this cast's slots start at
    0 (one launch, no sync). The cast is cast_weight's, or the shadow SGD's own, which
    writes the [out, in] copy and the amax as it writes the weight (--float8-lin1)."""
    _roll_kernel[(1,)](state, inverse, E4M3_MAX_=E4M3_MAX, SLOTS_=SLOTS)


def transpose(w8: torch.Tensor, w8t: torch.Tensor) -> None:
    """After the shadow SGD wrote w8 [out, in]: w8t [in, out], its transpose. It reads the
    1-byte copy (1.07 GB for lin1), where cast_weight reads the 2-byte weight (2.15 GB)."""
    rows, cols = w8.shape
    check_copies(w8, w8t, rows, cols)
    grid = (triton.cdiv(rows, BLOCK_ROWS), triton.cdiv(cols, BLOCK_COLS))
    _transpose_kernel[grid](w8.view(torch.uint8), w8t.view(torch.uint8), rows, cols,
                            BR=BLOCK_ROWS, BC=BLOCK_COLS, num_warps=NUM_WARPS)
