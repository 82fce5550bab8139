"""Fused GIoU kernels, each a torch custom op with autograd and a fake implementation.

    loss = giou_loss(pred, boxes, counts, backend="triton" | "cuda", conditional=False)

Naming ladder (per backend): _giou_fwd_kernel / _giou_bwd_kernel -> launchers inside the
custom op (giou::triton_loss, giou_cuda::loss) -> autograd registration -> bind_loss /
giou_loss -> the `kernel` and `conditional` strategies in losses/fused.py. A new backend
is one module here with an op `(pred, target, counts, conditional) -> (loss, denom)`, a
branch in bind_loss and one line in BACKENDS.
"""

import functools
import os

import torch

from errors import UserError
from losses.checks import check_padded

BACKENDS = ("triton", "cuda")


# Triton compiles for GPUs only; on a CPU-only machine its interpreter runs the same
# kernels on CPU tensors. The variable must be set before anything imports triton (torch's
# profiler and tensorboard writer may), so it is set when this package is first imported:
# losses.get() of a fused strategy imports it before the run starts.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def check_backend(backend: str) -> None:
    if backend not in BACKENDS:
        raise UserError(f"unknown kernel backend {backend!r}: choose one of "
                        f"{', '.join(BACKENDS)}")
    if backend == "cuda":
        from kernels.cuda_giou import unavailable_reason
        reason = unavailable_reason()
        if reason:
            raise UserError(reason)


@functools.lru_cache(maxsize=None)
def bind_loss(backend: str = "triton", conditional: bool = False):
    """The fused loss of one backend and variant, resolved once:
    (pred, boxes, counts) -> mean of 1 - GIoU over the valid slots; no host-device sync.

    Everything that does not depend on the inputs (the backend's module, the CUDA build,
    the op lookup) happens here, once per (backend, variant) and process, so a call is the
    input check and the op: the loss range of a step times only that, and giou_loss does
    not look for nvcc on every call. The Triton op checks its inputs itself (check_padded,
    in the op, so direct calls are checked too); the CUDA op checks in C++, with
    RuntimeErrors, so its call is preceded by the same Python checks for one-line errors."""
    check_backend(backend)
    if backend == "triton":
        from kernels.triton_giou import triton_loss as op
    else:
        from kernels.cuda_giou import load
        load()  # builds the extension on first use (about a minute), then loads it
        op = torch.ops.giou_cuda.loss.default

    def loss(pred: torch.Tensor, boxes: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
        if backend == "cuda":
            check_padded(pred, boxes, counts)
            if not pred.is_cuda:
                raise UserError(f"the CUDA kernel backend needs CUDA tensors, got {pred.device}")
        return op(pred, boxes, counts, conditional)[0]

    return loss


def giou_loss(pred: torch.Tensor, boxes: torch.Tensor, counts: torch.Tensor,
              backend: str = "triton", conditional: bool = False) -> torch.Tensor:
    """Mean of 1 - GIoU over the valid slots of a padded batch; no host-device sync."""
    return bind_loss(backend, conditional)(pred, boxes, counts)
