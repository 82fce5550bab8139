"""Fused GIoU loss in Triton: `_giou_fwd_kernel` + `_giou_finalize_kernel` forward,
`_giou_bwd_kernel` backward, launchers, and the `giou::triton_loss` custom op.

Why: the kernels read every slot in its own dtype and compute in fp32 (fp64 for fp64),
with no cast or copy first; `conditional` reads only the valid slots (28 KB against
3.15 MB at batch 1024, M 256).

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import triton
import triton.language as tl

from core.checks import check_padded
from core.giou_rules import EPS, compute_dtype
from kernels.triton_op import INTERPRETED, define_op, launch

# Per variant: slots per program (CHUNK), slots per loop step (BLOCK), slots per step of
# conditional's zero stores (ZERO_BLOCK), warps, and one pipeline stage (the loops' loads
# are not worth staging: 1 and 3 stages measured the same). Chosen on the H100 at make
# sweep's points (results/sweep.md). Programs of 1024 slots,
# not fewer: a grid of one small program per 128 slots spends its time loading counts and
# writing partials (32,768 programs at M = 4096); zero rows as [ZERO_BLOCK, 4] tiles, not
# four strided stores a slot, so the backward writes them near a memset's speed.
SHAPES = {False: dict(CHUNK=1024, BLOCK=256, ZERO_BLOCK=256, num_warps=4, num_stages=1),
          True: dict(CHUNK=1024, BLOCK=128, ZERO_BLOCK=512, num_warps=4, num_stages=1)}
FINALIZE_BLOCK = 1024


@triton.jit
def _d_max(a, b):
    """d max(a, b) / da with PyTorch's tie rule (half the gradient on a tie)."""
    return tl.where(a > b, 1.0, tl.where(a == b, 0.5, 0.0))


@triton.jit
def _load_coords(ptr, b, slots, mask, sb, sm, sc, COMPUTE: tl.constexpr):
    """The 4 coordinates of each slot as [BLOCK] columns x1, y1, x2, y2, four strided
    loads. (One [BLOCK, 4] load split into columns was slower on the H100: results/sweep.md.)"""
    p = ptr + b * sb + slots * sm
    x1 = tl.load(p, mask=mask, other=0).to(COMPUTE)
    y1 = tl.load(p + sc, mask=mask, other=0).to(COMPUTE)
    x2 = tl.load(p + 2 * sc, mask=mask, other=0).to(COMPUTE)
    y2 = tl.load(p + 3 * sc, mask=mask, other=0).to(COMPUTE)
    return x1, y1, x2, y2


@triton.jit
def _store_grads(grad_ptr, b, M, slots, mask, g1, g2, g3, g4):
    """Four [BLOCK] gradient columns stored as the rows of these slots (grad is
    contiguous)."""
    out = grad_ptr + (b * M + slots) * 4
    ty = grad_ptr.dtype.element_ty
    tl.store(out, g1.to(ty), mask=mask)
    tl.store(out + 1, g2.to(ty), mask=mask)
    tl.store(out + 2, g3.to(ty), mask=mask)
    tl.store(out + 3, g4.to(ty), mask=mask)


@triton.jit
def _store_rows(grad_ptr, b, M, slots, mask, rows):
    """A [ZERO_BLOCK, 4] tile stored as whole gradient rows: contiguous, vector stores."""
    offs = (b * M + slots)[:, None] * 4 + tl.arange(0, 4)[None, :]
    tl.store(grad_ptr + offs, rows.to(grad_ptr.dtype.element_ty), mask=mask[:, None])


@triton.jit
def _giou_parts(px1, py1, px2, py2, gx1, gy1, gx2, gy2):
    """The GIoU's pieces, shared by the forward and the backward: the raw and clamped
    intersection extents, the intersection, the union and the hull's extents."""
    iw_raw = tl.minimum(px2, gx2) - tl.maximum(px1, gx1)
    ih_raw = tl.minimum(py2, gy2) - tl.maximum(py1, gy1)
    iw = tl.maximum(iw_raw, 0.0)
    ih = tl.maximum(ih_raw, 0.0)
    inter = iw * ih
    union = (px2 - px1) * (py2 - py1) + (gx2 - gx1) * (gy2 - gy1) - inter
    cw = tl.maximum(px2, gx2) - tl.minimum(px1, gx1)
    ch = tl.maximum(py2, gy2) - tl.minimum(py1, gy1)
    return iw_raw, ih_raw, iw, ih, inter, union, cw, ch


@triton.jit
def _giou_term(px1, py1, px2, py2, gx1, gy1, gx2, gy2, EPS_: tl.constexpr):
    """1 - GIoU of each slot (core/giou_rules.py)."""
    _, _, _, _, inter, union, cw, ch = _giou_parts(px1, py1, px2, py2, gx1, gy1, gx2, gy2)
    hull = cw * ch
    return 1.0 - inter / (union + EPS_) + (hull - union) / (hull + EPS_)


@triton.jit
def _giou_grads(px1, py1, px2, py2, gx1, gy1, gx2, gy2, s, EPS_: tl.constexpr):
    """s * dGIoU/dp for each coordinate of p (the maths in _giou_bwd_kernel's docstring);
    shared with the packed layout's kernels (kernels/giou/triton_packed.py)."""
    wp = px2 - px1
    hp = py2 - py1
    iw_raw, ih_raw, iw, ih, inter, union, cw, ch = _giou_parts(
        px1, py1, px2, py2, gx1, gy1, gx2, gy2)
    a = 1.0 / (union + EPS_)
    c = 1.0 / (cw * ch + EPS_)
    g_u = c - inter * a * a
    g_i = a - g_u
    g_c = -(union + EPS_) * c * c
    mw = tl.where(iw_raw >= 0, 1.0, 0.0)
    mh = tl.where(ih_raw >= 0, 1.0, 0.0)
    g1 = s * (-g_u * hp - g_i * ih * mw * _d_max(px1, gx1) - g_c * ch * _d_max(gx1, px1))
    g2 = s * (-g_u * wp - g_i * iw * mh * _d_max(py1, gy1) - g_c * cw * _d_max(gy1, py1))
    g3 = s * (g_u * hp + g_i * ih * mw * _d_max(gx2, px2) + g_c * ch * _d_max(px2, gx2))
    g4 = s * (g_u * wp + g_i * iw * mh * _d_max(gy2, py2) + g_c * cw * _d_max(py2, gy2))
    return g1, g2, g3, g4


@triton.jit
def _chunk_limits(counts_ptr, b, chunk, M, CHUNK: tl.constexpr, CONDITIONAL: tl.constexpr):
    """This program's slots [lo, hi), the end of those it loads and computes (work_hi: the
    chunk's end for `kernel`, the sample's count within the chunk for `conditional`), the
    sample's count clamped to [0, M], and whether it was outside (checked before any cast,
    so an int64 count past 2^31 is not wrapped into range)."""
    raw = tl.load(counts_ptr + b)
    bad = (raw < 0) | (raw > M)
    n = tl.minimum(tl.maximum(raw, 0), M).to(tl.int32)
    lo = chunk * CHUNK
    hi = tl.minimum(lo + CHUNK, M)
    if CONDITIONAL:
        work_hi = tl.maximum(tl.minimum(hi, n), lo)
    else:
        work_hi = hi
    return lo, hi, work_hi, n, bad


@triton.jit
def _giou_fwd_kernel(pred_ptr, target_ptr, counts_ptr, partial_ptr, M,
                     spb, spm, spc, stb, stm, stc,
                     EPS_: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                     CONDITIONAL: tl.constexpr, COMPUTE: tl.constexpr):
    """partial[b, chunk] = sum over the chunk's valid slots of 1 - GIoU (NaN on a bad count).

    I = relu(min(px2,gx2) - max(px1,gx1)) * relu(min(py2,gy2) - max(py1,gy1))
    U = (px2-px1)(py2-py1) + (gx2-gx1)(gy2-gy1) - I,  C = hull width * hull height
    term = 1 - I/(U+eps) + (C-U)/(C+eps)
    """
    b = tl.program_id(0)
    chunk = tl.program_id(1)
    lo, hi, work_hi, n, bad = _chunk_limits(counts_ptr, b, chunk, M, CHUNK, CONDITIONAL)
    terms = tl.zeros((BLOCK,), dtype=COMPUTE)
    for start in range(lo, work_hi, BLOCK):
        slots = start + tl.arange(0, BLOCK)
        load = slots < work_hi
        px1, py1, px2, py2 = _load_coords(pred_ptr, b, slots, load, spb, spm, spc, COMPUTE)
        gx1, gy1, gx2, gy2 = _load_coords(target_ptr, b, slots, load, stb, stm, stc, COMPUTE)
        term = _giou_term(px1, py1, px2, py2, gx1, gy1, gx2, gy2, EPS_)
        terms += tl.where(slots < n, term, 0.0)
    partial = tl.where(bad, float("nan"), tl.sum(terms, axis=0))
    tl.store(partial_ptr + b * tl.num_programs(1) + chunk, partial)


@triton.jit
def _giou_finalize_kernel(partial_ptr, counts_ptr, loss_ptr, denom_ptr, P, B,
                          BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    """loss = sum(partials) / max(sum(counts), 1); also writes the denominator for the
    backward. One program; a fixed summation order, so the loss is deterministic."""
    acc = tl.zeros((BLOCK,), dtype=COMPUTE)
    for start in range(0, P, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(partial_ptr + offs, mask=offs < P, other=0.0)
    total = tl.sum(acc, axis=0)
    boxes = tl.zeros((BLOCK,), dtype=tl.int64)
    for start in range(0, B, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        boxes += tl.load(counts_ptr + offs, mask=offs < B, other=0).to(tl.int64)
    denom = tl.maximum(tl.sum(boxes, axis=0), 1).to(COMPUTE)
    tl.store(loss_ptr, total / denom)
    tl.store(denom_ptr, denom)


@triton.jit
def _giou_bwd_kernel(grad_loss_ptr, denom_ptr, pred_ptr, target_ptr, counts_ptr, grad_ptr,
                     M, spb, spm, spc, stb, stm, stc,
                     EPS_: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                     ZERO_BLOCK: tl.constexpr, CONDITIONAL: tl.constexpr,
                     COMPUTE: tl.constexpr):
    """grad[b, i, :] = -dGIoU/dp * grad_loss / denom for valid slots, 0 elsewhere.

    With a = 1/(U+eps), c = 1/(C+eps), and GIoU = I*a - 1 + (U+eps)*c:
      gU = dGIoU/dU = -I*a^2 + c        (U through area(p))
      gI = dGIoU/dI = a - gU            (I directly, and through U = ... - I)
      gC = dGIoU/dC = -(U+eps)*c^2
    area(p) = wp*hp:   d/dpx1 = -hp, d/dpx2 = hp, d/dpy1 = -wp, d/dpy2 = wp
    I = iw*ih, iw = relu(min(px2,gx2) - max(px1,gx1)); relu passes at 0 (mw = [raw >= 0]):
      dI/dpx1 = -ih*mw*dmax(px1,gx1), dI/dpx2 = ih*mw*dmin(px2,gx2)  (and y with iw, mh)
    C = cw*ch, cw = max(px2,gx2) - min(px1,gx1):
      dC/dpx1 = -ch*dmin(px1,gx1),    dC/dpx2 = ch*dmax(px2,gx2)     (and y with cw)
    dmax/dmin send 1 to the strict winner and 1/2 to each side of a tie (PyTorch's rule).
    """
    b = tl.program_id(0)
    chunk = tl.program_id(1)
    lo, hi, work_hi, n, bad = _chunk_limits(counts_ptr, b, chunk, M, CHUNK, CONDITIONAL)
    nan = tl.where(bad, float("nan"), 0.0)  # a bad count poisons this sample's gradient
    # dLoss/dp = -dGIoU/dp * scale.
    s = -(tl.load(grad_loss_ptr).to(COMPUTE) / tl.load(denom_ptr).to(COMPUTE))
    for start in range(lo, work_hi, BLOCK):
        slots = start + tl.arange(0, BLOCK)
        load = slots < work_hi
        px1, py1, px2, py2 = _load_coords(pred_ptr, b, slots, load, spb, spm, spc, COMPUTE)
        gx1, gy1, gx2, gy2 = _load_coords(target_ptr, b, slots, load, stb, stm, stc, COMPUTE)
        g1, g2, g3, g4 = _giou_grads(px1, py1, px2, py2, gx1, gy1, gx2, gy2, s, EPS_)
        # Invalid slots get exactly zero by selection, not by a zero factor: a NaN or inf
        # in a padding slot times 0 would still be NaN.
        valid = slots < n
        _store_grads(grad_ptr, b, M, slots, load, tl.where(valid, g1, 0.0) + nan,
                     tl.where(valid, g2, 0.0) + nan, tl.where(valid, g3, 0.0) + nan,
                     tl.where(valid, g4, 0.0) + nan)
    # conditional: the chunk's slots past the count (none for `kernel`) get zeros, stored
    # without a load or a flop. A loop of its own, so these steps are plain stores.
    zero = tl.zeros((ZERO_BLOCK, 4), dtype=COMPUTE) + nan
    for start in range(work_hi, hi, ZERO_BLOCK):
        slots = start + tl.arange(0, ZERO_BLOCK)
        _store_rows(grad_ptr, b, M, slots, slots < hi, zero)


def _tl_compute(pred: torch.Tensor):
    return tl.float64 if compute_dtype(pred) == torch.float64 else tl.float32


def _grid(pred, conditional):
    return (pred.shape[0], triton.cdiv(pred.shape[1], SHAPES[conditional]["CHUNK"]))


def _slot_kernel_meta(pred, conditional, backward: bool) -> dict:
    """Compile-time parameters of the forward or backward slot kernel."""
    shape = dict(SHAPES[conditional])
    if not backward:  # the forward writes no gradient
        del shape["ZERO_BLOCK"]
    return dict(EPS_=EPS, CONDITIONAL=conditional, COMPUTE=_tl_compute(pred), **shape)


@define_op("giou::triton_loss", mutates_args=())
def triton_loss(pred: torch.Tensor, target: torch.Tensor, counts: torch.Tensor,
                conditional: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, denominator) of the padded batch: 2 launches, no sync."""
    check_padded(pred, target, counts)
    grid = _grid(pred, conditional)
    dt = compute_dtype(pred)
    partial = torch.empty(grid[0] * grid[1], dtype=dt, device=pred.device)
    loss = torch.empty((), dtype=dt, device=pred.device)
    denom = torch.empty((), dtype=dt, device=pred.device)
    launch(_giou_fwd_kernel, grid,
        pred, target, counts, partial, pred.shape[1], *pred.stride(), *target.stride(),
        **_slot_kernel_meta(pred, conditional, backward=False))
    launch(_giou_finalize_kernel, (1,),
        partial, counts, loss, denom, partial.numel(), counts.shape[0],
        BLOCK=FINALIZE_BLOCK, COMPUTE=_tl_compute(pred), num_warps=4)
    return loss, denom


@define_op("giou::triton_loss_backward", mutates_args=())
def triton_loss_backward(grad_loss: torch.Tensor, denom: torch.Tensor, pred: torch.Tensor,
                         target: torch.Tensor, counts: torch.Tensor,
                         conditional: bool) -> torch.Tensor:
    """Gradient w.r.t. the predictions, in their dtype: 1 launch, no sync."""
    grad = torch.empty(pred.shape, dtype=pred.dtype, device=pred.device)
    launch(_giou_bwd_kernel, _grid(pred, conditional),
        grad_loss, denom, pred, target, counts, grad, pred.shape[1],
        *pred.stride(), *target.stride(),
        **_slot_kernel_meta(pred, conditional, backward=True))
    return grad


def _setup_context(ctx, inputs, output):
    pred, target, counts, conditional = inputs
    ctx.save_for_backward(pred, target, counts, output[1])
    ctx.conditional = conditional
    # The denominator gets no gradient; materialising a zero one would cost a fill launch.
    ctx.set_materialize_grads(False)


def _backward(ctx, grad_loss, _grad_denom):
    if grad_loss is None:  # no gradient flowed into the loss (grads are not materialised)
        return None, None, None, None
    pred, target, counts, denom = ctx.saved_tensors
    grad = triton_loss_backward(grad_loss, denom, pred, target, counts, ctx.conditional)
    return grad, None, None, None


triton_loss.register_autograd(_backward, setup_context=_setup_context)

if INTERPRETED:
    # The same checks as the op: inputs on the meta device beside CPU ones are dispatched
    # here, not to the op, and would otherwise come back as an uninitialised loss.
    @triton_loss.register_fake
    def _(pred, target, counts, conditional):
        check_padded(pred, target, counts)
        dt = compute_dtype(pred)
        return pred.new_empty((), dtype=dt), pred.new_empty((), dtype=dt)

    @triton_loss_backward.register_fake
    def _(grad_loss, denom, pred, target, counts, conditional):
        return torch.empty(pred.shape, dtype=pred.dtype, device=pred.device)
