"""Fused GIoU loss over the packed layout in Triton: `_packed_fwd_kernel` +
`_packed_finalize_kernel` forward, a zero fill + `_packed_bwd_kernel` backward, and the
`giou::triton_packed_loss` custom op.

Layout (data/collate.py, collate_packed): the batch's N valid boxes as one [N, 4] tensor
(any integer or float dtype), and index [2, N] int32 or int64: row 0 each box's image,
row 1 its slot in that image's predictions. Predictions [B, M, 4] (fp16/bf16/fp32/fp64,
any strides). loss = sum over the boxes of 1 - GIoU(pred[image, slot], box) / max(N, 1).
N is the targets' shape, host metadata, so the denominator costs no reduction.

Grid: cdiv(N, BLOCK) programs, each owning BLOCK boxes: no program exists for an empty
slot or an empty image, whatever B and M are. The forward gathers each box's prediction
by (image, slot); the backward scatters its gradient there. Every other gradient row is
zero: the backward fills the gradient with zeros first (one memset, the same bytes as
`conditional`'s zero rows) and then writes the boxes' rows. The fill is a separate launch
because no program here owns a range of rows: a box may name any row, so zero stores from
one program could land after another's gradient.

Gradient: per box exactly that of kernels/triton_giou.py's `_giou_bwd_kernel` docstring,
scaled by -grad_loss / max(N, 1) (the shared `_giou_grads`).

Contract (core/giou_rules.py): an image outside [0, B) or a slot outside [0, M) cannot be
checked on the host without a sync; such a box is never read or written, and makes the
loss NaN and every box's gradient NaN (the denominator is NaN). Each (image, slot) must
be named at most once (the collate's layout); two boxes on one slot would race in the
backward, and this is not checked. NaN or inf in a slot no box names never matters.

Byte ledger at B=1024, M=256, bf16 predictions, uint8 boxes, int32 index, 1.915 valid
boxes per image (N ~ 1961):
  forward: reads N*(8 + 4 + 8) = 39 KB, writes 8 bytes a program (2 partials);
  finalize: reads 2 partials a program, writes 8 bytes;
  backward: the fill writes B*M*8 = 2.1 MB (33.5 MB at M = 4096); the scatter reads
  39 KB again and writes N*8 = 16 KB.
  The H2D copy of the targets: N*12 bytes, 24 KB, against B*M*4 + 4B = 1.05 MB padded.
"""

import torch
import triton
import triton.language as tl

from core.checks import check_packed
from core.giou_rules import EPS, compute_dtype
from kernels.triton_giou import _giou_grads, _giou_term, _load_coords, _tl_compute
from kernels.triton_op import INTERPRETED, define_op, launch

BLOCK = 256            # boxes per program
FINALIZE_BLOCK = 1024


@triton.jit
def _box_places(index_ptr, si_row, si_box, B, M, boxes, live):
    """Each box's image and slot, whether it is in range, and whether it may be read."""
    image = tl.load(index_ptr + boxes * si_box, mask=live, other=0)
    slot = tl.load(index_ptr + si_row + boxes * si_box, mask=live, other=0)
    bad = live & ((image < 0) | (image >= B) | (slot < 0) | (slot >= M))
    return image, slot, bad, live & ~bad


@triton.jit
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


@triton.jit
def _packed_finalize_kernel(partial_ptr, loss_ptr, denom_ptr, P, N,
                            BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    """loss = sum(partials) / denom, denom = max(N, 1), or NaN when a box was out of range
    (the backward then makes every box's gradient NaN). One program, a fixed order."""
    acc = tl.zeros((BLOCK,), dtype=COMPUTE)
    bad = tl.zeros((BLOCK,), dtype=COMPUTE)
    for start in range(0, P, BLOCK):
        offs = start + tl.arange(0, BLOCK)
        acc += tl.load(partial_ptr + offs, mask=offs < P, other=0.0)
        bad += tl.load(partial_ptr + P + offs, mask=offs < P, other=0.0)
    denom = tl.where(tl.sum(bad, axis=0) > 0, float("nan"), tl.maximum(N, 1).to(COMPUTE))
    tl.store(loss_ptr, tl.sum(acc, axis=0) / denom)
    tl.store(denom_ptr, denom)


@triton.jit
def _packed_bwd_kernel(grad_loss_ptr, denom_ptr, pred_ptr, boxes_ptr, index_ptr, grad_ptr,
                       N, B, M, spb, spm, spc, sbn, sbc, si_row, si_box,
                       EPS_: tl.constexpr, BLOCK: tl.constexpr, COMPUTE: tl.constexpr):
    """grad[image, slot] = -dGIoU/dp * grad_loss / denom for each box in range; the
    gradient is contiguous and already zero elsewhere."""
    pid = tl.program_id(0)
    boxes = pid * BLOCK + tl.arange(0, BLOCK)
    image, slot, _, ok = _box_places(index_ptr, si_row, si_box, B, M, boxes, boxes < N)
    s = -(tl.load(grad_loss_ptr).to(COMPUTE) / tl.load(denom_ptr).to(COMPUTE))
    px1, py1, px2, py2 = _load_coords(pred_ptr, image, slot, ok, spb, spm, spc, COMPUTE)
    gx1, gy1, gx2, gy2 = _load_coords(boxes_ptr, 0, boxes, ok, 0, sbn, sbc, COMPUTE)
    g1, g2, g3, g4 = _giou_grads(px1, py1, px2, py2, gx1, gy1, gx2, gy2, s, EPS_)
    out = grad_ptr + (image.to(tl.int64) * M + slot) * 4
    ty = grad_ptr.dtype.element_ty
    tl.store(out, g1.to(ty), mask=ok)
    tl.store(out + 1, g2.to(ty), mask=ok)
    tl.store(out + 2, g3.to(ty), mask=ok)
    tl.store(out + 3, g4.to(ty), mask=ok)


def _programs(boxes: torch.Tensor) -> int:
    return triton.cdiv(boxes.shape[0], BLOCK)


def _meta(pred) -> dict:
    return dict(EPS_=EPS, BLOCK=BLOCK, COMPUTE=_tl_compute(pred), num_warps=4)


@define_op("giou::triton_packed_loss", mutates_args=())
def triton_packed_loss(pred: torch.Tensor, boxes: torch.Tensor,
                       index: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(loss, denominator) over the packed boxes: 2 launches (1 with no box), no sync."""
    check_packed(pred, boxes, index)
    P, (N, B, M) = _programs(boxes), (boxes.shape[0], pred.shape[0], pred.shape[1])
    dt = compute_dtype(pred)
    partial = torch.empty(2 * P, dtype=dt, device=pred.device)
    loss = torch.empty((), dtype=dt, device=pred.device)
    denom = torch.empty((), dtype=dt, device=pred.device)
    if P > 0:
        launch(_packed_fwd_kernel, (P,), pred, boxes, index, partial, N, B, M,
               *pred.stride(), *boxes.stride(), *index.stride(), **_meta(pred))
    launch(_packed_finalize_kernel, (1,), partial, loss, denom, P, N,
           BLOCK=FINALIZE_BLOCK, COMPUTE=_tl_compute(pred), num_warps=4)
    return loss, denom


@define_op("giou::triton_packed_loss_backward", mutates_args=())
def triton_packed_loss_backward(grad_loss: torch.Tensor, denom: torch.Tensor,
                                pred: torch.Tensor, boxes: torch.Tensor,
                                index: torch.Tensor) -> torch.Tensor:
    """Gradient w.r.t. the predictions, in their dtype: a zero fill and 1 launch, no sync."""
    grad = torch.zeros(pred.shape, dtype=pred.dtype, device=pred.device)
    P = _programs(boxes)
    if P > 0:
        launch(_packed_bwd_kernel, (P,), grad_loss, denom, pred, boxes, index, grad,
               boxes.shape[0], pred.shape[0], pred.shape[1], *pred.stride(),
               *boxes.stride(), *index.stride(), **_meta(pred))
    return grad


def _setup_context(ctx, inputs, output):
    pred, boxes, index = inputs
    ctx.save_for_backward(pred, boxes, index, output[1])
    ctx.set_materialize_grads(False)  # the denominator gets no gradient: no fill launch


def _backward(ctx, grad_loss, _grad_denom):
    if grad_loss is None:
        return None, None, None
    pred, boxes, index, denom = ctx.saved_tensors
    return triton_packed_loss_backward(grad_loss, denom, pred, boxes, index), None, None


triton_packed_loss.register_autograd(_backward, setup_context=_setup_context)

if INTERPRETED:
    @triton_packed_loss.register_fake
    def _(pred, boxes, index):
        check_packed(pred, boxes, index)
        dt = compute_dtype(pred)
        return pred.new_empty((), dtype=dt), pred.new_empty((), dtype=dt)

    @triton_packed_loss_backward.register_fake
    def _(grad_loss, denom, pred, boxes, index):
        return torch.empty(pred.shape, dtype=pred.dtype, device=pred.device)
