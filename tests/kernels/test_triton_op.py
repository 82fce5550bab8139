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
