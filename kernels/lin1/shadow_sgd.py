"""SGD with momentum for a bf16 weight that keeps fp32 master weights (`--bf16-shadow`):
one Triton kernel reads the bf16 gradient, updates the fp32 master and momentum, and writes
the bf16 copy the next forward uses.

Why: under bf16 autocast lin1's fp32 weights cost two full casts a step besides the
optimizer (6.45 GB each); this one pass does both: 20 bytes an element, 21.5 GB a step for
lin1 against 34.4 GB.

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import triton
import triton.language as tl

from core.errors import InputError
from kernels.lin1.float8_cast import (
    E4M3_MAX,
    SLOTS,
    check_copies,
    check_state,
    e4m3_rtne,
    roll,
    transpose,
)
from kernels.lin1.master_halves import join_bits, split_bits, tie_words
from kernels.rounding import bf16_rtne

BLOCK = 4096
NUM_WARPS = 8
# The split form's block: 8 elements a thread, not 16. Beside the trunk (the step's
# update, lin1_update_beside_trunk) the smaller blocks fit where the trunk leaves room
# (results/step.md has the shapes measured); alone both run at HBM's rate.
SPLIT_BLOCK = 2048
SPLIT_WARPS = 8


@triton.jit
def _momentum(grad_ptr, buf_ptr, offs, mask, momentum, FIRST: tl.constexpr):
    """torch's SGD momentum in fp32: the bf16 gradient on the first step, mu * buf + g
    after it (the first step reads no buf)."""
    g = tl.load(grad_ptr + offs, mask=mask, other=0).to(tl.float32)
    if FIRST:
        buf = g
    else:
        buf = tl.load(buf_ptr + offs, mask=mask, other=0) * momentum + g
    return buf


@triton.jit
def _widened(bf16_bits):
    """A bf16 value, or its bits as int16, as fp32: exact, by its bits (the interpreter's
    casts are not to be trusted, kernels/rounding.py)."""
    bits = bf16_bits.to(tl.uint16, bitcast=True).to(tl.uint32)
    return (bits << 16).to(tl.float32, bitcast=True)


@triton.jit
def _float8_copy(w8_ptr, state_ptr, offs, mask, weight, E4M3_MAX_: tl.constexpr,
                 SLOTS_: tl.constexpr):
    """The new bf16 weight (held in fp32) -> its e4m3 copy at offs, by the state's scale,
    as float8_cast's cast kernel rounds it; its amax into slot program % SLOTS_ of the
    state (element 2 on: float8_cast.AMAX_NOW)."""
    scaled = tl.minimum(tl.maximum(weight * tl.load(state_ptr), -E4M3_MAX_), E4M3_MAX_)
    tl.store(w8_ptr + offs, e4m3_rtne(scaled).to(tl.float8e4nv), mask=mask)
    amax = tl.max(tl.where(mask, tl.abs(weight), 0.0))
    # |w| >= 0: a max is exact. Relaxed: only the next launch (the roll) reads the slots,
    # and a launch's end orders them; acq_rel (Triton's default) fenced every block.
    tl.atomic_max(state_ptr + 2 + tl.program_id(0) % SLOTS_, amax, sem="relaxed")


@triton.jit
def _shadow_sgd_kernel(master_ptr, grad_ptr, buf_ptr, shadow_ptr, w8_ptr, state_ptr, n, lr,
                       momentum, FIRST: tl.constexpr, BLOCK_: tl.constexpr,
                       FLOAT8: tl.constexpr, E4M3_MAX_: tl.constexpr, SLOTS_: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK_ + tl.arange(0, BLOCK_)
    mask = offs < n
    buf = _momentum(grad_ptr, buf_ptr, offs, mask, momentum, FIRST)
    master = tl.load(master_ptr + offs, mask=mask, other=0) - lr * buf
    tl.store(buf_ptr + offs, buf, mask=mask)
    tl.store(master_ptr + offs, master, mask=mask)
    shadow = bf16_rtne(master)
    tl.store(shadow_ptr + offs, shadow, mask=mask)
    if FLOAT8:
        _float8_copy(w8_ptr, state_ptr, offs, mask, _widened(shadow), E4M3_MAX_, SLOTS_)


@triton.jit
def _split_sgd_kernel(low_ptr, grad_ptr, buf_ptr, hi_ptr, ties_ptr, w8_ptr, state_ptr, n, lr,
                      momentum, FIRST: tl.constexpr, WORDS: tl.constexpr,
                      SKIP_UNCHANGED: tl.constexpr, FLOAT8: tl.constexpr,
                      E4M3_MAX_: tl.constexpr, SLOTS_: tl.constexpr):
    # hi_ptr: the bf16 weight's bits as int16; ties_ptr: a word of tie bits for 32 elements.
    words = tl.program_id(0).to(tl.int64) * WORDS + tl.arange(0, WORDS)
    bit = tl.arange(0, 32)[None, :]
    offs = words[:, None] * 32 + bit
    mask = offs < n
    buf = _momentum(grad_ptr, buf_ptr, offs, mask, momentum, FIRST)
    # The words as [WORDS, 1] columns, not [WORDS] vectors: the rows' own layout, so that
    # neither the word's bits nor their sum go through shared memory.
    word = words[:, None]
    was = tl.load(ties_ptr + word, mask=word * 32 < n, other=0)
    old = tl.load(hi_ptr + offs, mask=mask, other=0)
    master = join_bits(old, tl.load(low_ptr + offs, mask=mask, other=0), (was >> bit) & 1)
    master = master - lr * buf
    tl.store(buf_ptr + offs, buf, mask=mask)
    hi, low, tie = split_bits(master)
    tl.store(low_ptr + offs, low, mask=mask)
    if SKIP_UNCHANGED:  # the weight's bits stored only where they changed (skip_unchanged)
        tl.store(hi_ptr + offs, hi, mask=mask & (hi != old))
    else:
        tl.store(hi_ptr + offs, hi, mask=mask)
    now = tl.sum(tie << bit, axis=1, keep_dims=True)  # distinct bits: their sum is their or
    tl.store(ties_ptr + word, now, mask=(word * 32 < n) & (now != was))
    if FLOAT8:
        _float8_copy(w8_ptr, state_ptr, offs, mask, _widened(hi), E4M3_MAX_, SLOTS_)


def shadow_sgd_step(master: torch.Tensor, grad: torch.Tensor, buf: torch.Tensor,
                    shadow: torch.Tensor, lr: float, momentum: float, first: bool,
                    ties: torch.Tensor | None = None, skip_unchanged: bool = False,
                    float8: tuple | None = None) -> None:
    """One step, in place on master, buf and shadow (and ties): one launch, no sync.
    master is the fp32 master, or under --split-master its int16 low half with its tie
    bits (shadow its high half). skip_unchanged (split form only): shadow's elements are
    stored only where the update changed them (training/speedups/skip_unchanged_weight.py).
    float8 (--float8-lin1): (w8, w8t, state, inverse), the weight's e4m3 copies and
    their scale's state (kernels/lin1/float8_cast.py): the scale rolled first, w8
    [out, in] written from the new weight by this launch, w8t [in, out] transposed from
    it after; three launches in all."""
    tensors = (master, grad, buf, shadow)
    split = master.dtype == torch.int16
    if master.dtype not in (torch.float32, torch.int16) or buf.dtype != torch.float32:
        raise InputError("shadow SGD keeps fp32 master weights (or their int16 low half) "
                         "and fp32 momentum")
    if not all(t.shape == master.shape and t.is_contiguous() for t in tensors):
        raise InputError("shadow SGD takes contiguous tensors of one shape")
    if split != (ties is not None) or split and (
            ties.dtype != torch.int32 or ties.shape != tie_words(master.shape)
            or not ties.is_contiguous()):
        raise InputError("shadow SGD takes tie bits (int32, 32 elements a word) with an "
                         "int16 low half, and only with it")
    if len({t.device for t in (*tensors, *([ties] if split else []))}) != 1:
        raise InputError("shadow SGD's tensors must be on one device")
    w8, w8t, state, inverse = float8 or (None,) * 4
    if float8 is not None:
        if master.dim() != 2:
            raise InputError("shadow SGD writes float8 copies of a 2-D weight only")
        check_copies(w8, w8t, *master.shape)
        check_state(state, inverse)
        if {t.device for t in float8} != {master.device}:
            raise InputError("shadow SGD's float8 copies must be on the weight's device")
        roll(state, inverse)
    n = master.numel()
    float8_args = dict(FLOAT8=float8 is not None, E4M3_MAX_=E4M3_MAX, SLOTS_=SLOTS)
    if split:
        _split_sgd_kernel[(triton.cdiv(n, SPLIT_BLOCK),)](
            master, grad, buf, shadow.view(torch.int16), ties, w8, state, n, lr, momentum,
            FIRST=first, WORDS=SPLIT_BLOCK // 32, SKIP_UNCHANGED=skip_unchanged,
            **float8_args, num_warps=SPLIT_WARPS)
    else:
        _shadow_sgd_kernel[(triton.cdiv(n, BLOCK),)](
            master, grad, buf, shadow, w8, state, n, lr, momentum, FIRST=first,
            BLOCK_=BLOCK, **float8_args, num_warps=NUM_WARPS)
    if float8 is not None:
        transpose(w8, w8t)
