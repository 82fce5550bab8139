"""The case study's fused GIoU loss, each backend (Triton, CUDA C++) a torch custom op
with autograd and a fake implementation: giou_loss for the padded layout,
bind_packed_loss for the packed one. Its design in full: docs/kernels.md."""

import functools

import torch

from core.checks import check_packed, check_padded
from core.errors import BackendUnavailable, InputError
from core.names import BACKENDS
from kernels import TRITON_BEFORE_INTERPRETER


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}: choose one of "
                         f"{', '.join(BACKENDS)}")
    if backend == "cuda":
        from kernels.giou.cuda_extension import unavailable_reason
        reason = unavailable_reason()
        if reason:
            raise BackendUnavailable(f"{reason}; the triton backend runs here")
    elif TRITON_BEFORE_INTERPRETER:
        raise BackendUnavailable(
            "triton was imported before TRITON_INTERPRET=1 was set, so its kernels cannot "
            "run on this CPU-only machine: import losses or kernels before triton, or set "
            "TRITON_INTERPRET=1 in the environment")


def _check_cuda(pred: torch.Tensor) -> None:
    """The CUDA ops' one-line error for tensors elsewhere (the C++ check's is a
    RuntimeError); the layout checks before it have put every input on pred's device."""
    if not pred.is_cuda:
        raise InputError(f"the CUDA kernel backend needs CUDA tensors, got {pred.device}")


@functools.lru_cache(maxsize=None)
def bind_loss(backend: str = "triton", conditional: bool = False):
    """The fused loss of one backend and variant, resolved once:
    (pred, boxes, counts) -> mean of 1 - GIoU over the valid slots; no host-device sync.

    Everything that does not depend on the inputs (the backend's module, the CUDA build,
    the op lookup) happens here, once per (backend, variant) and process, so a call is the
    input check and the op. The Triton op checks its inputs itself (check_padded, in the
    op, so direct calls are checked too); the CUDA op checks in C++, with RuntimeErrors,
    so its call is preceded by the same Python checks for one-line errors."""
    check_backend(backend)
    if backend == "triton":
        from kernels.giou.triton_padded import triton_loss

        def loss(pred: torch.Tensor, boxes: torch.Tensor, counts: torch.Tensor):
            return triton_loss(pred, boxes, counts, conditional)[0]
        return loss

    from kernels.giou.cuda_extension import load
    load()  # builds the extension on first use (about a minute), then loads it
    op = torch.ops.giou_cuda.loss.default

    def loss(pred: torch.Tensor, boxes: torch.Tensor, counts: torch.Tensor):
        check_padded(pred, boxes, counts)
        _check_cuda(pred)
        return op(pred, boxes, counts, conditional)[0]
    return loss


@functools.lru_cache(maxsize=None)
def bind_packed_loss(backend: str = "triton"):
    """The fused loss over the packed layout, resolved once as bind_loss is:
    (pred, boxes [N, 4], index [2, N], offsets [B + 1]) -> mean of 1 - GIoU over the N
    boxes; no sync."""
    check_backend(backend)
    if backend == "triton":
        from kernels.giou.triton_packed import triton_packed_loss

        def loss(pred: torch.Tensor, boxes: torch.Tensor, index: torch.Tensor,
                 offsets: torch.Tensor):
            return triton_packed_loss(pred, boxes, index, offsets)[0]
        return loss

    from kernels.giou.cuda_extension import load
    load()
    op = torch.ops.giou_cuda.packed_loss.default

    def loss(pred: torch.Tensor, boxes: torch.Tensor, index: torch.Tensor,
             offsets: torch.Tensor):
        check_packed(pred, boxes, index, offsets)
        _check_cuda(pred)
        return op(pred, boxes, index, offsets)[0]
    return loss


def giou_loss(pred: torch.Tensor, boxes: torch.Tensor, counts: torch.Tensor,
              backend: str = "triton", conditional: bool = False) -> torch.Tensor:
    """Mean of 1 - GIoU over the valid slots of a padded batch; no host-device sync."""
    return bind_loss(backend, conditional)(pred, boxes, counts)
