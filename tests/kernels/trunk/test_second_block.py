"""The Triton second block (conv 4->16 -> max-pool -> ReLU) against a float64 reference:
value and every gradient (input, weight, bias) over odd sizes, batch 1, fp32, bf16 and
fp16 inputs, both layouts, exact ties and dead ReLUs; opcheck; gradcheck in float64; one
clear error for bad inputs."""

import re

import pytest
import torch

from core.errors import InputError
from kernels.trunk.second_block import second_block, second_block_op
from tests.cases import second_block_inputs
from tests.reference import rel_err, second_block_reference

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SIZES = [(1, 2, 2), (3, 6, 10), (2, 18, 34), (1, 32, 64)]
# On the GPU each size of one pooled pixel a side is its own compile (Triton specialises
# an argument equal to 1): batch 1 is (1, 32, 64) there.
CASES = [("cpu", *size) for size in SIZES] + [
    pytest.param("cuda", *size, marks=pytest.mark.gpu) for size in SIZES if size != (1, 2, 2)]


def _check_against_reference(x, weight, bias, tol):
    """Value and dL/dx in x's dtype within tol; dL/dw and dL/dbias (accumulated in fp32)
    within 1e-4, each against float64 given the same (rounded) upstream gradient."""
    x = x.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    out = second_block(x, w, b)
    B, _, H, W = x.shape
    assert out.dtype == x.dtype and out.shape == (B, 16, H // 2, W // 2)
    nhwc = x.is_contiguous(memory_format=torch.channels_last) and not x.is_contiguous()
    assert out.is_contiguous(memory_format=torch.channels_last if nhwc else
                             torch.contiguous_format)
    x64, w64, b64 = (t.detach().double().cpu().requires_grad_(True) for t in (x, w, b))
    ref = second_block_reference(x64, w64, b64)
    assert rel_err(out.cpu(), ref) < tol
    grad = torch.randn(out.shape, dtype=torch.float64).to(out.dtype)
    d_x, d_w, d_b = torch.autograd.grad(out, (x, w, b), grad.to(out.device))
    r_x, r_w, r_b = torch.autograd.grad(ref, (x64, w64, b64), grad.double())
    assert d_x.dtype == x.dtype and d_x.stride() == x.stride()
    assert d_w.dtype == weight.dtype and d_b.dtype == bias.dtype
    assert rel_err(d_x.cpu(), r_x) < tol
    assert rel_err(d_w.cpu(), r_w) < 1e-4 and rel_err(d_b.cpu(), r_b) < 1e-4


@pytest.mark.parametrize("device,B,H,W", CASES)
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2),
                                       (torch.float16, 2e-3)])
@pytest.mark.parametrize("channels_last", [False, True])
def test_value_and_gradients_match_float64(device, B, H, W, dtype, tol, channels_last):
    _check_against_reference(*second_block_inputs(B, H, W, device, dtype, channels_last), tol)


def test_a_draw_with_a_near_decision_is_drawn_again():
    """A draw whose pool holds a window with two values 1.1e-7 apart in float64 (found by
    a CPU count of fp32's choices against float64's: 3 draws in 10,000 at this size; this
    file's bounds failed on it) is drawn again; a draw without one is kept."""
    near, _, _ = second_block_inputs(2, 18, 34, "cpu", seed=2039165518)
    far, _, _ = second_block_inputs(2, 18, 34, "cpu", seed=1)
    gen = torch.Generator()
    assert not torch.equal(near, torch.randn(2, 4, 18, 34, generator=gen.manual_seed(2039165518)))
    assert torch.equal(far, torch.randn(2, 4, 18, 34, generator=gen.manual_seed(1)))


@pytest.mark.parametrize("device", DEVICES)
def test_exact_ties_follow_max_pool_and_dead_relus_get_no_gradient(device):
    # Integer inputs and weights in quarters: every sum is exact in fp32 and bf16, so a
    # window of equal values is an exact tie, which max_pool2d gives to its first element.
    gen = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item())
    x = torch.randint(0, 2, (2, 4, 8, 12), generator=gen).float().repeat_interleave(2, -1)
    x = x.repeat_interleave(2, -2)[:, :, :8, :12].contiguous().to(device)
    weight = (torch.randint(-4, 5, (16, 4, 3, 3), generator=gen) / 4).to(device)
    bias = (torch.randint(-4, 5, (16,), generator=gen) / 4).to(device)
    # (A gradient sent to the wrong window would be an error of order 1, not 1e-2.)
    for dtype, tol in ((torch.float32, 1e-6), (torch.bfloat16, 1e-2)):
        _check_against_reference(x.to(dtype), weight, bias, tol)
    # Every output below zero: ReLU passes no gradient anywhere.
    x, weight, _ = second_block_inputs(2, 8, 12, device)
    bias = torch.full((16,), -100.0, device=device, requires_grad=True)
    x.requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    out = second_block(x, w, bias)
    assert (out == 0).all()
    d_x, d_w, d_b = torch.autograd.grad(out.sum(), (x, w, bias))
    assert (d_x == 0).all() and (d_w == 0).all() and (d_b == 0).all()


@pytest.mark.parametrize("device", DEVICES)
def test_opcheck(device):
    x, weight, bias = second_block_inputs(2, 6, 10, device)
    torch.library.opcheck(second_block_op, (x.requires_grad_(True), weight.requires_grad_(True),
                                            bias.requires_grad_(True)))


@pytest.mark.parametrize("device", DEVICES)
def test_gradcheck_float64(device):
    x, weight, bias = second_block_inputs(1, 4, 6, device, torch.float64)
    inputs = tuple(t.requires_grad_(True) for t in (x, weight, bias))
    # fast_mode: one random direction instead of every input element (each call of the
    # interpreted kernels costs about a second on the CPU).
    assert torch.autograd.gradcheck(second_block, inputs, eps=1e-6, atol=1e-7,
                                    fast_mode=True)


@pytest.mark.parametrize("change,message", [
    (lambda x, w, b: (x[:, :3], w, b), "takes floating-point x [B, 4, H, W]"),
    (lambda x, w, b: (x.int(), w, b), "takes floating-point x [B, 4, H, W]"),
    (lambda x, w, b: (x[:, :, :5], w, b), "H and W must be even"),
    (lambda x, w, b: (x, w[:8], b), "is Conv2d(4, 16, 3)"),
    (lambda x, w, b: (x, w.half(), b), "takes fp32 (or fp64) weight"),
])
def test_bad_inputs_are_one_clear_error(change, message):
    x, weight, bias = second_block_inputs(1, 6, 6, "cpu")
    with pytest.raises(InputError, match=re.escape(message)):
        second_block(*change(x, weight, bias))


@pytest.mark.parametrize("device", DEVICES)
def test_programs_that_walk_several_blocks_give_the_same_gradients(device, monkeypatch):
    """The weight- and input-gradient kernels are persistent: with fewer programs than
    blocks each program walks several, its weights made once."""
    import kernels.trunk.second_block as sb
    monkeypatch.setattr(sb, "XGRAD_PROGRAMS", 3)
    monkeypatch.setattr(sb, "WGRAD_PROGRAMS", 2)
    if device == "cuda":
        torch._dynamo.reset()
    _check_against_reference(*second_block_inputs(2, 18, 34, device, torch.bfloat16, True),
                             1e-2)
