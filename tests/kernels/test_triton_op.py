"""kernels/triton_op.py's allocation of the Triton ops' outputs: the layouts, and why they
are made with aten.empty (AOTAutograd's common-subexpression pass merges identical
empty_strided calls, and a merged output made Inductor copy the buffer before each
Triton kernel that wrote it: results/step.md)."""

import pytest
import torch
from torch._functorch.compile_utils import fx_graph_cse
from torch.fx.experimental.proxy_tensor import make_fx

from kernels.triton_op import empty_4d, is_nhwc

SHAPE = (2, 4, 6, 8)


@pytest.mark.parametrize("channels_last", [False, True])
def test_empty_4d_has_the_layouts_strides(channels_last):
    t = empty_4d(SHAPE, torch.bfloat16, "cpu", channels_last)
    assert t.shape == SHAPE and t.dtype == torch.bfloat16
    expected = torch.empty(SHAPE).to(memory_format=torch.channels_last if channels_last
                                      else torch.contiguous_format).stride()
    assert t.stride() == expected and is_nhwc(t) == channels_last


def _allocations_left_by_cse(alloc) -> int:
    """How many allocations of two same-shaped buffers survive AOTAutograd's CSE, in a
    graph where neither buffer is itself an output (as a forward's output and a
    backward's input gradient are not, in the joint graph)."""
    def f(x):
        a = alloc()
        b = alloc()
        return a + x, b * x

    graph = fx_graph_cse(make_fx(f)(torch.ones(())).graph)
    return sum(1 for n in graph.nodes
               if n.op == "call_function" and "empty" in str(n.target))


def test_two_same_shaped_outputs_stay_two_buffers_under_aot_cse():
    assert _allocations_left_by_cse(
        lambda: empty_4d(SHAPE, torch.bfloat16, "cpu", True)) == 2
    assert _allocations_left_by_cse(
        lambda: empty_4d(SHAPE, torch.bfloat16, "cpu", False)) == 2
    # The allocation empty_4d used before: CSE makes it one buffer. If a torch version
    # stops merging it, this says so (and the reason for empty_4d's form is gone).
    strides = torch.empty(SHAPE).to(memory_format=torch.channels_last).stride()
    assert _allocations_left_by_cse(
        lambda: torch.empty_strided(SHAPE, strides, dtype=torch.bfloat16)) == 1


def test_the_compile_caches_are_keyed_on_the_kernels_sources(tmp_path):
    import shutil

    from kernels import triton_op
    assert triton_op.sources_tag() in torch.compiler.config.cache_key_tag
    copy = tmp_path / "kernels"
    shutil.copytree(triton_op.REPO_KERNELS, copy,
                    ignore=shutil.ignore_patterns("__pycache__"))
    assert triton_op.sources_tag(copy) == triton_op.sources_tag()
    pool = copy / "trunk" / "pool.py"
    pool.write_text(pool.read_text().replace("0x8000", "0x8001", 1))
    edited = triton_op.sources_tag(copy)
    assert edited != triton_op.sources_tag()
    (copy / "trunk" / "new_block.py").write_text("")
    assert triton_op.sources_tag(copy) not in (edited, triton_op.sources_tag())


# A kernel launched through launch(), as every one here is, in a package of its own; the
# program compiles a function of it and prints what it returns.
_KERNEL = """
import torch, triton, triton.language as tl
from kernels.triton_op import define_op, launch

@triton.jit
def _plus(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    offs = tl.arange(0, BLOCK)
    tl.store(y_ptr + offs, tl.load(x_ptr + offs, mask=offs < n) + ADDED, mask=offs < n)

@define_op("cachetest::plus", mutates_args=())
def plus(x: torch.Tensor) -> torch.Tensor:
    y = torch.empty_like(x)
    launch(_plus, (1,), x, y, x.numel(), BLOCK=16)
    return y
"""
_PROGRAM = """
import sys, torch
from pathlib import Path
from kernels.triton_op import sources_tag
if sys.argv[1] == "tagged":
    torch.compiler.config.cache_key_tag += sources_tag(Path(sys.argv[2]) / "pkg")
sys.path.insert(0, sys.argv[2])
from pkg.kernel import plus
print(int(torch.compile(lambda x: plus(x) * 1)(torch.zeros(4, device="cuda"))[0]))
"""


@pytest.mark.gpu
def test_a_kernels_edit_reaches_the_compiled_function_through_a_warm_cache(tmp_path):
    """Two processes, one Inductor cache, the kernel edited between them: with the
    kernels' sources in the cache's key the second runs the edited kernel."""
    import os
    import subprocess
    import sys

    from tests.helpers import REPO
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "__init__.py").write_text("")
    program = tmp_path / "program.py"
    program.write_text(_PROGRAM)
    env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor"),
           "PYTHONPATH": str(REPO)}

    def run(added: int, how: str) -> int:
        (tmp_path / "pkg" / "kernel.py").write_text(_KERNEL.replace("ADDED", str(added)))
        done = subprocess.run([sys.executable, str(program), how, str(tmp_path)], env=env,
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        return int(done.stdout.split()[-1])

    assert run(1, "tagged") == 1
    assert run(2, "tagged") == 2
