"""lin1's weight-gradient GEMM with the shadow SGD in its epilogue, in CUDA C++ with
CUTLASS 3 (csrc/dw_sgd.cu): built on first use with torch.utils.cpp_extension (ninja),
cached in build/lin1_dw_sgd/, for sm_90a (H100, H200) only.

Why one kernel: apart, the dW GEMM writes the 2.15 GB bf16 gradient and the shadow SGD
reads it back beside the master and momentum (20 bytes an element, 21.5 GB). Fused, the
gradient never leaves the SM: the epilogue reads master and momentum and writes them and
the bf16 weight, 18 bytes an element (19.3 GB, 5.8 ms at 3.35 TB/s), while the GEMM's
2.2 TFLOP take 2.2 ms at the tensor cores' peak. A warp-specialised kernel overlaps the
two (a producer warp streams the epilogue's master and momentum by TMA while the other
consumer warp group runs its tile's MMAs), so the floor is the update's bytes, not the sum.

CUTLASS's headers come from the `nvidia-cutlass` package (requirements-gpu.txt) or from
$CUTLASS_PATH (a CUTLASS checkout). The maths is the shadow SGD's (shadow_sgd.py) with the
GEMM's accumulator rounded to bf16 first, as the gradient the GEMM alone would have written;
its momentum starts as zeros, so its first step is the same as torch's SGD's.
"""

import importlib.util
import os
import shutil
from pathlib import Path

import torch

from core.errors import BackendUnavailable

CSRC = Path(__file__).parent / "csrc"
SOURCES = [CSRC / "dw_sgd.cu", CSRC / "dw_sgd_more.cu", CSRC / "dw_sgd_binding.cpp"]
HEADERS = [CSRC / "dw_sgd.h"]  # dw_sgd_more.cu includes dw_sgd.cu: its crc too
BUILD_DIR = Path(__file__).resolve().parents[2] / "build" / "lin1_dw_sgd"
# dw_sgd.cu's V0, V1 and dw_sgd_more.cu's V0, V1, in dw_sgd_launch's order.
VARIANTS = ("pingpong cluster 2x2 epi 64x32 C4 D2", "pingpong cluster 2x1 epi 64x32 C4 D2",
            "pingpong cluster 2x2 epi 64x64 C2 D1", "pingpong cluster 1x4 epi 64x32 C4 D2")

_ext = None


def cutlass_root() -> Path | None:
    """The CUTLASS source tree whose include/ and tools/util/include/ the build reads."""
    if os.environ.get("CUTLASS_PATH"):
        return Path(os.environ["CUTLASS_PATH"])
    spec = importlib.util.find_spec("cutlass_library")
    if spec is None or not spec.submodule_search_locations:
        return None
    root = Path(next(iter(spec.submodule_search_locations))) / "source"
    return root if (root / "include" / "cute").is_dir() else None


def unavailable_reason() -> str | None:
    """Why the fused kernel cannot run here, or None."""
    if not torch.cuda.is_available():
        return "needs a CUDA GPU"
    if torch.cuda.get_device_capability() != (9, 0):
        return f"needs an sm90 GPU (H100, H200), not {torch.cuda.get_device_name()}"
    from torch.utils.cpp_extension import CUDA_HOME
    if shutil.which("nvcc") is None and not (CUDA_HOME and Path(CUDA_HOME, "bin", "nvcc").exists()):
        return "needs nvcc (the CUDA toolkit)"
    if cutlass_root() is None:
        return "needs CUTLASS's headers: pip install nvidia-cutlass, or set CUTLASS_PATH"
    return None


def load():
    """Build (first time, about 1.5 min) or load the extension."""
    global _ext
    if _ext is not None:
        return _ext
    reason = unavailable_reason()
    if reason:
        raise BackendUnavailable(f"the fused dW GEMM and update {reason}")
    import zlib

    from torch.utils.cpp_extension import load as load_extension
    root = cutlass_root()
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    # torch rebuilds when a source or a flag changes, not a header: the header's hash is
    # a flag. wgmma and TMA need the arch-specific target sm_90a, not torch's sm_90.
    crc = zlib.crc32(b"".join(h.read_bytes() for h in HEADERS))
    flags = ["-O3", "-DNDEBUG", f"-DDW_SGD_HEADERS_CRC={crc}"]
    includes = [str(root / "include"), str(root / "tools" / "util" / "include"), str(CSRC)]
    arch = os.environ.get("TORCH_CUDA_ARCH_LIST")
    os.environ["TORCH_CUDA_ARCH_LIST"] = "9.0a"
    try:
        _ext = load_extension(
            name="lin1_dw_sgd_ext", sources=[str(s) for s in SOURCES],
            build_directory=str(BUILD_DIR), extra_include_paths=includes,
            extra_cflags=flags, extra_cuda_cflags=[*flags, "--expt-relaxed-constexpr",
                                                   "-std=c++17", "-lineinfo"],
            verbose=False)
    finally:
        if arch is None:
            del os.environ["TORCH_CUDA_ARCH_LIST"]
        else:
            os.environ["TORCH_CUDA_ARCH_LIST"] = arch
    return _ext


def dw_sgd_step(dy: torch.Tensor, x: torch.Tensor, master: torch.Tensor, buf: torch.Tensor,
                shadow: torch.Tensor, lr: float, momentum: float, variant: int = 0) -> None:
    """dW = dY^T X, then the shadow SGD on master, buf and shadow in place, in one kernel
    on the current stream: dY [K, M] and X [K, N] bf16, the rest [M, N]. No sync."""
    load().dw_sgd(dy, x, master, buf, shadow, float(lr), float(momentum), int(variant))
