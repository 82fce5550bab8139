"""How every Triton kernel here becomes a torch custom op, on a GPU and in the interpreter.

    @define_op("giou::triton_loss", mutates_args=())
    def triton_loss(...):
        launch(_giou_fwd_kernel, grid, *args, **meta)

On a GPU the launchers are a torch.library.triton_op, which torch.compile decomposes so
that Inductor sees the kernels themselves. Under Triton's interpreter (TRITON_INTERPRET=1,
the CPU tests) torch cannot trace into the kernels (wrap_triton hands back the raw
kernel), so the launchers are an opaque custom_op, and each op registers an explicit fake.
"""

import hashlib
from pathlib import Path

import torch
import triton
from torch.library import triton_op, wrap_triton


@triton.jit
def _probe():
    pass


def _is_interpreted(kernel) -> bool:
    from triton.runtime.interpreter import InterpretedFunction
    return isinstance(kernel, InterpretedFunction)


INTERPRETED = _is_interpreted(_probe)
define_op = torch.library.custom_op if INTERPRETED else triton_op


REPO_KERNELS = Path(__file__).parent


def sources_tag(root: Path = REPO_KERNELS) -> str:
    """A hash of every Python file under root (kernels/): the Triton kernels' sources."""
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes())
    return f"kernels-{digest.hexdigest()[:16]}"


def _tag_compile_caches() -> None:
    """Keys torch.compile's caches on the kernels' sources. AOTAutograd's cache keys a
    triton_op by the kernels torch finds in its source, and it finds none behind launch():
    after a kernel's edit, a warm cache served the compiled step with the old kernel
    (seen on an H100, results/trunk.md)."""
    config = torch.compiler.config
    tag = sources_tag()
    if hasattr(config, "cache_key_tag") and tag not in config.cache_key_tag:
        config.cache_key_tag = f"{config.cache_key_tag}{tag}"


_tag_compile_caches()


def launch(kernel, grid, *args, **meta) -> None:
    """Launches a @triton.jit kernel from inside a define_op function."""
    if INTERPRETED:
        kernel[grid](*args, **meta)
    else:
        wrap_triton(kernel)[grid](*args, **meta)


def is_nhwc(x: torch.Tensor) -> bool:
    """Whether x is laid out channels_last (and not also plainly contiguous, as a tensor of
    one channel or one pixel is): the layout a kernel's outputs and gradients keep."""
    return x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()


def empty_4d(shape, dtype, device, channels_last: bool) -> torch.Tensor:
    """An uninitialised [B, C, H, W] tensor, NHWC where channels_last: torch.empty of
    [B, H, W, C] seen through a permute.

    Why not empty_strided or memory_format: compiled, a triton_op's output must be a fresh
    buffer the kernel can write in place, or Inductor copies the buffer before the
    kernel. AOTAutograd's common-subexpression pass merges identical aten.empty_strided
    calls (it spares only aten.empty: torch/_functorch/compile_utils.py, fx_graph_cse),
    so a block's output and the same-shaped input gradient of the next block's backward
    became one buffer, saved for the backward; Inductor could then reinplace neither
    kernel and cloned the uninitialised buffer before each (triton_poi_fused_0 and _3,
    a 134 MB copy each, four a step at the GPU preset: bench/trunk_kernels.py,
    results/step.md). torch.empty(..., memory_format=
    torch.channels_last) became a kernel that wrote the whole tensor."""
    B, C, H, W = shape
    if channels_last:
        return torch.empty((B, H, W, C), dtype=dtype, device=device).permute(0, 3, 1, 2)
    return torch.empty(shape, dtype=dtype, device=device)
