"""The CUDA C++ GIoU op: built on first use with torch.utils.cpp_extension (ninja), cached
in build/giou_cuda/, then given a fake implementation and autograd here in Python (the
pattern of pytorch/extension-cpp: the schema lives in C++, the rest in Python)."""

import shutil
from pathlib import Path

import torch

from errors import UserError

SOURCE = Path(__file__).parent / "csrc" / "giou.cu"
BUILD_DIR = Path(__file__).resolve().parent.parent / "build" / "giou_cuda"

_loaded = False


def unavailable_reason() -> str | None:
    """Why the CUDA backend cannot run here, or None if it can."""
    if not torch.cuda.is_available():
        return "the CUDA kernel backend needs a CUDA GPU and nvcc; use --kernel triton"
    if torch.version.cuda is None or shutil.which("nvcc") is None and not _cuda_home_nvcc():
        return "the CUDA kernel backend needs nvcc (the CUDA toolkit); use --kernel triton"
    return None


def _cuda_home_nvcc() -> bool:
    from torch.utils.cpp_extension import CUDA_HOME
    return CUDA_HOME is not None and (Path(CUDA_HOME) / "bin" / "nvcc").exists()


def load() -> None:
    """Build (first time, ~1 min) or load the extension and register fake + autograd."""
    global _loaded
    if _loaded:
        return
    reason = unavailable_reason()
    if reason:
        raise UserError(reason)
    from torch.utils.cpp_extension import load as load_extension
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    load_extension(name="giou_cuda_ext", sources=[str(SOURCE)], build_directory=str(BUILD_DIR),
                   extra_cuda_cflags=["-O3", "-lineinfo"], is_python_module=False,
                   verbose=False)
    _register_python_parts()
    _loaded = True


def _register_python_parts() -> None:
    @torch.library.register_fake("giou_cuda::loss")
    def _(pred, target, counts, conditional):
        dt = torch.promote_types(pred.dtype, torch.float32)
        return pred.new_empty((), dtype=dt), pred.new_empty((), dtype=dt)

    @torch.library.register_fake("giou_cuda::loss_backward")
    def _(grad_loss, denom, pred, target, counts, conditional):
        return torch.empty(pred.shape, dtype=pred.dtype, device=pred.device)

    def setup_context(ctx, inputs, output):
        pred, target, counts, conditional = inputs
        ctx.save_for_backward(pred, target, counts, output[1])
        ctx.conditional = conditional
        ctx.set_materialize_grads(False)  # no zero gradient (and fill launch) for denom

    def backward(ctx, grad_loss, _grad_denom):
        if grad_loss is None:  # no gradient flowed into the loss (grads not materialised)
            return None, None, None, None
        pred, target, counts, denom = ctx.saved_tensors
        grad = torch.ops.giou_cuda.loss_backward(grad_loss, denom, pred, target, counts,
                                                 ctx.conditional)
        return grad, None, None, None

    torch.library.register_autograd("giou_cuda::loss", backward, setup_context=setup_context)


def cuda_loss(pred, target, counts, conditional: bool):
    load()
    return torch.ops.giou_cuda.loss(pred, target, counts, conditional)
