"""Fused GIoU loss over the packed layout in Triton: `_packed_fwd_kernel` +
`_packed_finalize_kernel` forward, `_packed_bwd_kernel` backward, and the
`giou::triton_packed_loss` custom op.

Why: a forward program exists only for the N valid boxes, gathered by (image, slot): 39 KB
read at batch 1024, M 256; the backward writes the dense gradient in one launch, no memset.

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import triton
import triton.language as tl

from core.checks import check_packed
from core.giou_rules import EPS, compute_dtype
from kernels.giou.triton_padded import (
    SHAPES,
    _giou_grads,
    _giou_term,
    _load_coords,
    _store_grads,
    _store_rows,
    _tl_compute,
)
from kernels.triton_op import INTERPRETED, define_op, launch

BLOCK = 256            # boxes per forward program
FINALIZE_BLOCK = 1024
BWD = SHAPES[True]     # the backward's chunk, step and zero-row shapes: conditional's


@triton.jit
def _box_places(index_ptr, si_row, si_box, B, M, boxes, live):
    """Each box's image and slot, whether it is out of range, and whether it may be read."""
    image = tl.load(index_ptr + boxes * si_box, mask=live, other=0)
    slot = tl.load(index_ptr + si_row + boxes * si_box, mask=live, other=0)
    bad = live & ((image < 0) | (image >= B) | (slot < 0) | (slot >= M))
    return image, slot, bad, live & ~bad


# N (and what follows from it: the forward's programs P, the index's row stride) changes
# with every batch. Triton specialises an int on being 1 or a multiple of 16, so each
# kernel compiled again the first time a batch's N fell in the other class, a step of
# half a second in the middle of an epoch (results/step.md). Not specialised, each kernel
# compiles once.
_VARIES_WITH_N = ["N", "P", "si_row"]


@triton.jit(do_not_specialize=_VARIES_WITH_N)
def _packed_fwd_kernel(pred_ptr, boxes_ptr, index_ptr, partial_ptr, N, B, M,
                       spb, spm, spc, sbn, sbc, si_row, si_box,
                       EPS_: tl.constexpr, BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    """partial[pid] = sum of this program's boxes' 1 - GIoU; partial[P + pid] = how many of
    its boxes name a place outside the predictions."""
    pid = tl.program_id(0)
    boxes = pid * BLOCK + tl.arange(0, BLOCK)
    image, slot, bad, ok = _box_places(index_ptr, si_row, si_box, B, M, boxes, boxes < N)
    px1, py1, px2, py2 = _load_coords(pred_ptr, image, slot, ok, spb, spm, spc, COMPUTE)
    gx1, gy1, gx2, gy2 = _load_coords(boxes_ptr, 0, boxes, ok, 0, sbn, sbc, COMPUTE)
    term = _giou_term(px1, py1, px2, py2, gx1, gy1, gx2, gy2, EPS_)
    tl.store(partial_ptr + pid, tl.sum(tl.where(ok, term, 0.0), axis=0))
    tl.store(partial_ptr + tl.num_programs(0) + pid,
             tl.sum(tl.where(bad, 1.0, 0.0), axis=0).to(COMPUTE))


@triton.jit(do_not_specialize=_VARIES_WITH_N)
def _packed_finalize_kernel(partial_ptr, offsets_ptr, loss_ptr, denom_ptr, P, N, B, M,
                            BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    """loss = sum(partials) / denom, denom = max(N, 1), or NaN when a box was out of range
    or the offsets do not partition the N boxes into counts within [0, M] (the backward
    then makes every box's gradient NaN). One program, a fixed order."""
    acc = tl.zeros((BLOCK,), dtype=COMPUTE)
    bad = tl.zeros((BLOCK,), dtype=COMPUTE)
    for start in range(0, P, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(partial_ptr + offs, mask=offs < P, other=0.0)
        bad += tl.load(partial_ptr + P + offs, mask=offs < P, other=0.0)
    for start in range(0, B, BLOCK):
        b = start + tl.arange(0, BLOCK)
        first = tl.load(offsets_ptr + b, mask=b < B, other=0)
        end = tl.load(offsets_ptr + b + 1, mask=b < B, other=0)
        count = end - first
        bad += tl.where((b < B) & ((count < 0) | (count > M)), 1.0, 0.0)
    ends = tl.load(offsets_ptr + tl.arange(0, 2) * B)  # offsets[0] and offsets[B]
    partition = tl.sum(tl.where(ends == tl.arange(0, 2) * N, 0, 1), axis=0) == 0
    any_bad = (tl.sum(bad, axis=0) > 0) | ~partition
    denom = tl.where(any_bad, float("nan"), tl.maximum(N, 1).to(COMPUTE))
    tl.store(loss_ptr, tl.sum(acc, axis=0) / denom)
    tl.store(denom_ptr, denom)


@triton.jit(do_not_specialize=_VARIES_WITH_N)
def _packed_bwd_kernel(grad_loss_ptr, denom_ptr, pred_ptr, boxes_ptr, offsets_ptr, grad_ptr,
                       N, M, spb, spm, spc, sbn, sbc,
                       EPS_: tl.constexpr, CHUNK: tl.constexpr, BLOCK: tl.constexpr,
                       ZERO_BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    """grad[b, slot] = -dGIoU/dp * grad_loss / denom for slot < image b's count, against
    box offsets[b] + slot; 0 for the rest of the chunk; NaN in every row of an image whose
    offsets are out of range (its boxes are then not read)."""
    b = tl.program_id(0)
    chunk = tl.program_id(1)
    first = tl.load(offsets_ptr + b)
    end = tl.load(offsets_ptr + b + 1)
    bad = (end - first < 0) | (end - first > M) | (first < 0) | (end > N)
    n = tl.where(bad, 0, end - first).to(tl.int32)
    nan = tl.where(bad, float("nan"), 0.0)
    lo = chunk * CHUNK
    hi = tl.minimum(lo + CHUNK, M)
    work_hi = tl.maximum(tl.minimum(hi, n), lo)
    s = -(tl.load(grad_loss_ptr).to(COMPUTE) / tl.load(denom_ptr).to(COMPUTE))
    for start in range(lo, work_hi, BLOCK):
        slots = start + tl.arange(0, BLOCK)
        load = slots < work_hi
        px1, py1, px2, py2 = _load_coords(pred_ptr, b, slots, load, spb, spm, spc, COMPUTE)
        gx1, gy1, gx2, gy2 = _load_coords(boxes_ptr, 0, first + slots, load, 0, sbn, sbc,
                                          COMPUTE)
        g1, g2, g3, g4 = _giou_grads(px1, py1, px2, py2, gx1, gy1, gx2, gy2, s, EPS_)
        _store_grads(grad_ptr, b, M, slots, load, g1, g2, g3, g4)
    # The chunk's slots past the count: zero rows, stored without a load or a flop.
    zero = tl.zeros((ZERO_BLOCK, 4), dtype=COMPUTE) + nan
    for start in range(work_hi, hi, ZERO_BLOCK):
        slots = start + tl.arange(0, ZERO_BLOCK)
        _store_rows(grad_ptr, b, M, slots, slots < hi, zero)


def _programs(boxes: torch.Tensor) -> int:
    return triton.cdiv(boxes.shape[0], BLOCK)


def _bwd_grid(pred) -> tuple[int, int]:
    return pred.shape[0], triton.cdiv(pred.shape[1], BWD["CHUNK"])


@define_op("giou::triton_packed_loss", mutates_args=())
def triton_packed_loss(pred: torch.Tensor, boxes: torch.Tensor, index: torch.Tensor,
                       offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, denominator) over the packed boxes: 2 launches (1 with no box), no sync."""
    check_packed(pred, boxes, index, offsets)
    P, (N, B, M) = _programs(boxes), (boxes.shape[0], pred.shape[0], pred.shape[1])
    dt = compute_dtype(pred)
    partial = torch.empty(2 * P, dtype=dt, device=pred.device)
    loss = torch.empty((), dtype=dt, device=pred.device)
    denom = torch.empty((), dtype=dt, device=pred.device)
    if P > 0:
        launch(_packed_fwd_kernel, (P,), pred, boxes, index, partial, N, B, M,
               *pred.stride(), *boxes.stride(), *index.stride(),
               EPS_=EPS, BLOCK=BLOCK, COMPUTE=_tl_compute(pred), num_warps=4)
    launch(_packed_finalize_kernel, (1,), partial, offsets, loss, denom, P, N, B, M,
           BLOCK=FINALIZE_BLOCK, COMPUTE=_tl_compute(pred), num_warps=4)
    return loss, denom


@define_op("giou::triton_packed_loss_backward", mutates_args=())
def triton_packed_loss_backward(grad_loss: torch.Tensor, denom: torch.Tensor,
                                pred: torch.Tensor, boxes: torch.Tensor,
                                offsets: torch.Tensor) -> torch.Tensor:
    """Gradient w.r.t. the predictions, in their dtype: 1 launch writes every row, no sync."""
    grad = torch.empty(pred.shape, dtype=pred.dtype, device=pred.device)
    if pred.numel() > 0:
        launch(_packed_bwd_kernel, _bwd_grid(pred), grad_loss, denom, pred, boxes, offsets,
               grad, boxes.shape[0], pred.shape[1], *pred.stride(), *boxes.stride(),
               EPS_=EPS, COMPUTE=_tl_compute(pred), **BWD)
    return grad


def _setup_context(ctx, inputs, output):
    pred, boxes, _index, offsets = inputs
    ctx.save_for_backward(pred, boxes, offsets, output[1])
    ctx.set_materialize_grads(False)  # the denominator gets no gradient: no fill launch


def _backward(ctx, grad_loss, _grad_denom):
    if grad_loss is None:
        return None, None, None, None
    pred, boxes, offsets, denom = ctx.saved_tensors
    grad = triton_packed_loss_backward(grad_loss, denom, pred, boxes, offsets)
    return grad, None, None, None


triton_packed_loss.register_autograd(_backward, setup_context=_setup_context)

if INTERPRETED:
    @triton_packed_loss.register_fake
    def _(pred, boxes, index, offsets):
        check_packed(pred, boxes, index, offsets)
        dt = compute_dtype(pred)
        return pred.new_empty((), dtype=dt), pred.new_empty((), dtype=dt)

    @triton_packed_loss_backward.register_fake
    def _(grad_loss, denom, pred, boxes, offsets):
        return torch.empty(pred.shape, dtype=pred.dtype, device=pred.device)
