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


# A kernel launched through launch(), as every one here is, added to kernels/ in a copy of
# the tree; the program compiles a function of it and prints what it returns.
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
PROGRAM = ("import torch; from kernels.cache_test_kernel import plus; "
           "print(int(torch.compile(lambda x: plus(x) * 1)(torch.zeros(4, device='cuda'))[0]))")


def compiled_plus(tree, tmp_path, added: int) -> str:
    """What PROGRAM prints in `tree` with the kernel adding `added`; Inductor's cache is
    the one under tmp_path (python_in's TMPDIR), the same for every call."""
    from tests.helpers import python_in
    (tree / "kernels" / "cache_test_kernel.py").write_text(_KERNEL.replace("ADDED", str(added)))
    done = python_in(tree, tmp_path, "-c", PROGRAM, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout.split()[-1]


@pytest.mark.gpu
def test_a_kernels_edit_reaches_the_compiled_function_through_a_warm_cache(tmp_path):
    """Two processes, one Inductor cache, a kernel under kernels/ edited between them: the
    second runs the edited kernel (the sources' tag in the cache's key)."""
    from tests.helpers import copy_of_the_tree
    tree = copy_of_the_tree(tmp_path)
    assert compiled_plus(tree, tmp_path, 1) == "1"
    assert compiled_plus(tree, tmp_path, 2) == "2"
