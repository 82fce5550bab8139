"""The CUDA C++ GIoU op: built on first use with torch.utils.cpp_extension (ninja), cached
in build/giou_cuda/. The schema and the CUDA kernels live in csrc/giou.cu (padded) and
csrc/packed.cu (packed), what they share in csrc/giou_common.cuh, the autograd in
csrc/giou_autograd.cpp (C++, so that a call never enters Python after torch.ops), and the
fake implementations that torch.compile traces with here in Python."""

import shutil
from pathlib import Path

import torch

from core.errors import BackendUnavailable

SOURCES = [Path(__file__).parent / "csrc" / name
           for name in ("giou.cu", "packed.cu", "giou_autograd.cpp")]
HEADERS = [Path(__file__).parent / "csrc" / "giou_common.cuh"]
BUILD_DIR = Path(__file__).resolve().parents[2] / "build" / "giou_cuda"

_loaded = False


def unavailable_reason() -> str | None:
    """Why the CUDA backend cannot run here, or None if it can. Only the reason: what to
    do instead is the caller's to say, in the words of how it was called (make's
    BACKEND=, train.py's --backend, a study's row)."""
    if not torch.cuda.is_available():
        return "the CUDA kernel backend needs a CUDA GPU and nvcc"
    if torch.version.cuda is None or shutil.which("nvcc") is None and not _cuda_home_nvcc():
        return "the CUDA kernel backend needs nvcc (the CUDA toolkit)"
    return None


def _cuda_home_nvcc() -> bool:
    from torch.utils.cpp_extension import CUDA_HOME
    return CUDA_HOME is not None and (Path(CUDA_HOME) / "bin" / "nvcc").exists()


def load() -> None:
    """Build (first time, ~1 min) or load the extension and register the fakes."""
    global _loaded
    if _loaded:
        return
    reason = unavailable_reason()
    if reason:
        raise BackendUnavailable(f"{reason}; the triton backend runs here")
    from torch.utils.cpp_extension import load as load_extension
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    # torch rebuilds when a source or a flag changes, not a header: the header's hash is
    # a flag, so editing it rebuilds too.
    header = f"-DGIOU_HEADERS_CRC={_headers_crc()}"
    load_extension(name="giou_cuda_ext", sources=[str(s) for s in SOURCES],
                   build_directory=str(BUILD_DIR), extra_cflags=["-O3", header],
                   extra_cuda_cflags=["-O3", "-lineinfo", header], is_python_module=False,
                   verbose=False)
    _register_fakes()
    _loaded = True


def _headers_crc() -> int:
    import zlib
    return zlib.crc32(b"".join(h.read_bytes() for h in HEADERS))


def _check_one_device(*tensors) -> None:
    """The fakes' own check. Real inputs on CUDA and on the meta device together are sent
    to the fake (the meta kernel) rather than to the CUDA one, which would say no: without
    this check the op would return an uninitialised loss, no error."""
    devices = [t.device for t in tensors]
    if len(set(devices)) > 1:
        raise RuntimeError("giou_cuda: predictions, targets and counts must be on one device, "
                           f"got {', '.join(map(str, devices))}")


def _register_fakes() -> None:
    @torch.library.register_fake("giou_cuda::loss")
    def _(pred, target, counts, conditional):
        _check_one_device(pred, target, counts)
        dt = torch.promote_types(pred.dtype, torch.float32)
        return pred.new_empty((), dtype=dt), pred.new_empty((), dtype=dt)

    @torch.library.register_fake("giou_cuda::loss_backward")
    def _(grad_loss, denom, pred, target, counts, conditional):
        _check_one_device(grad_loss, denom, pred, target, counts)
        return torch.empty(pred.shape, dtype=pred.dtype, device=pred.device)

    @torch.library.register_fake("giou_cuda::packed_loss")
    def _(pred, boxes, index, offsets):
        _check_one_device(pred, boxes, index, offsets)
        dt = torch.promote_types(pred.dtype, torch.float32)
        return pred.new_empty((), dtype=dt), pred.new_empty((), dtype=dt)

    @torch.library.register_fake("giou_cuda::packed_loss_backward")
    def _(grad_loss, denom, pred, boxes, offsets):
        _check_one_device(grad_loss, denom, pred, boxes, offsets)
        return torch.empty(pred.shape, dtype=pred.dtype, device=pred.device)
