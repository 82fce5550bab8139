"""The Triton first block (conv 1->4 -> max-pool -> ReLU) against a float64 reference:
value and every gradient over odd sizes, batch 1, fp32, bf16 and fp16 outputs, both
layouts, ties and dead ReLUs; opcheck; gradcheck in float64; one clear error for bad
inputs. Each with both backwards: recomputing the conv, and from the kept pool code
(keep_code, kernels/trunk/first_block_bwd.py)."""

import re

import pytest
import torch

from core.errors import InputError
from kernels.trunk.first_block import first_block, first_block_op
from tests.reference import (
    drawn_until,
    first_block_reference,
    nearest_pool_decision,
    rel_err,
)

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SIZES = [(1, 2, 2), (3, 6, 10), (2, 18, 34), (1, 64, 64)]
KEEP_CODE = pytest.mark.parametrize("keep_code", [False, True], ids=["recompute", "code"])


def _inputs(B, H, W, device, image="random"):
    """Fresh random inputs, drawn again while a decision lies too near (_decisive)."""
    def draw(gen):
        if image == "random":
            images = torch.randint(0, 256, (B, 1, H, W), generator=gen, dtype=torch.uint8)
        else:  # one value everywhere: every pooling window is a tie inside the image
            images = torch.full((B, 1, H, W), 77, dtype=torch.uint8)
        weight = torch.randn(4, 1, 3, 3, generator=gen) * 0.5
        return images, weight, torch.randn(4, generator=gen) * 0.1

    return tuple(t.to(device) for t in drawn_until(draw, _decisive))


# The kernel decides in fp32, the reference in float64. Where a window's two largest values,
# or its max and -bias, lie closer than fp32 resolves, the two may choose differently and
# the gradient goes to another pixel: one draw in about 3,000 at 64x64 (a CPU count of
# fp32's choices against float64's), which moved dL/dweight by 1.5 % in `make test-gpu` on
# two H200s. Such inputs sit where the block has no gradient; they are drawn again. Exact
# ties (equal pixels: equal values in any precision) stay, and have a test of their own.
NEAR = 1e-5


def _decisive(images, weight, bias) -> bool:
    v = torch.nn.functional.conv2d(images.double() / 255, weight.double(), bias.double(),
                                   padding=1)
    return nearest_pool_decision(v) >= NEAR


def test_a_near_tie_is_drawn_again():
    """The check itself, on one 2x2 window whose conv is the centre tap alone: an exact tie
    passes; values 1e-7 apart, or a max 1e-7 from -bias, do not."""
    images = torch.tensor([[[[200, 200], [0, 0]]]], dtype=torch.uint8)
    weight = torch.zeros(4, 1, 3, 3)
    weight[:, 0, 1, 1] = 1.0
    assert _decisive(images, weight, torch.zeros(4))  # 200 and 200: an exact tie
    assert not _decisive(images, weight, torch.full((4,), 1e-7 - 200 / 255))
    images[0, 0, 0, 1] = 199
    weight[:, 0, 1, 1] = 2.55e-5  # 200 and 199 of 255, 1e-7 apart after the conv
    assert not _decisive(images, weight, torch.zeros(4))
    weight[:, 0, 1, 1] = 1.0
    assert _decisive(images, weight, torch.zeros(4))


def _check_against_reference(images, weight, bias, out_dtype, channels_last, tol,
                             keep_code=False):
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    out = first_block(images, w, b, out_dtype, channels_last, keep_code)
    assert out.dtype == out_dtype and out.shape == (images.shape[0], 4, images.shape[2] // 2,
                                                    images.shape[3] // 2)
    assert out.is_contiguous(memory_format=torch.channels_last if channels_last else
                             torch.contiguous_format)
    w64 = weight.double().cpu().requires_grad_(True)
    b64 = bias.double().cpu().requires_grad_(True)
    ref = first_block_reference(images.cpu(), w64, b64)
    assert rel_err(out.cpu(), ref) < tol
    grad = torch.randn(out.shape, dtype=torch.float64)
    d_w, d_b = torch.autograd.grad(out, (w, b), grad.to(out.device, out_dtype))
    # The reference gets the gradient as the kernel saw it (rounded to out_dtype).
    r_w, r_b = torch.autograd.grad(ref, (w64, b64), grad.to(out_dtype).double())
    assert d_w.dtype == weight.dtype and d_b.dtype == bias.dtype
    assert rel_err(d_w.cpu(), r_w) < 1e-4 and rel_err(d_b.cpu(), r_b) < 1e-4


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("B,H,W", SIZES)
@pytest.mark.parametrize("out_dtype,tol", [(torch.float32, 1e-6), (torch.bfloat16, 1e-2)])
@pytest.mark.parametrize("channels_last", [False, True])
@KEEP_CODE
def test_value_and_gradients_match_float64(device, B, H, W, out_dtype, tol, channels_last,
                                           keep_code):
    _check_against_reference(*_inputs(B, H, W, device), out_dtype, channels_last, tol,
                             keep_code)


@pytest.mark.parametrize("device", DEVICES)
def test_fp16_outputs_with_the_code_match_float64(device):
    """fp16 outputs, so fp16 gradients into the code backward (the model's autocast may
    be fp16; the recomputing backward is checked with fp32 and bf16 above)."""
    _check_against_reference(*_inputs(2, 18, 34, device), torch.float16, True, 1e-3, True)


@pytest.mark.parametrize("device", DEVICES)
@KEEP_CODE
def test_ties_follow_max_pool_and_dead_relus_get_no_gradient(device, keep_code):
    images, weight, bias = _inputs(2, 8, 12, device, image="constant")
    _check_against_reference(images, weight, bias, torch.float32, False, 1e-6, keep_code)
    # Every output below zero: ReLU passes no gradient anywhere.
    images, weight, _ = _inputs(2, 8, 12, device)
    bias = torch.full((4,), -100.0, device=device)
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    out = first_block(images, w, b, keep_code=keep_code)
    assert (out == 0).all()
    d_w, d_b = torch.autograd.grad(out.sum(), (w, b))
    assert (d_w == 0).all() and (d_b == 0).all()


@pytest.mark.parametrize("device", DEVICES)
@KEEP_CODE
def test_opcheck(device, keep_code):
    images, weight, bias = _inputs(2, 6, 10, device)
    torch.library.opcheck(first_block_op, (images, weight.requires_grad_(True),
                                           bias.requires_grad_(True), torch.float32, False,
                                           keep_code))


@pytest.mark.parametrize("device", DEVICES)
@KEEP_CODE
def test_gradcheck_float64(device, keep_code):
    images, weight, bias = _inputs(1, 4, 6, device)
    w = weight.double().requires_grad_(True)
    b = bias.double().requires_grad_(True)
    # fast_mode: one random direction instead of every input element (each call of the
    # interpreted kernel costs about a second on the CPU).
    assert torch.autograd.gradcheck(
        lambda w_, b_: first_block(images, w_, b_, torch.float64, keep_code=keep_code),
        (w, b), eps=1e-6, atol=1e-7, fast_mode=True)


def test_the_code_says_which_window_position_won_and_where_the_relu_is_dead():
    """The kept code against max_pool2d's own indices on the float64 conv: the position
    in the window, or 4 where the pooled value plus the bias is not above zero."""
    import torch.nn.functional as F
    images, weight, bias = _inputs(2, 10, 14, "cpu")
    out, code = first_block_op(images, weight, bias, torch.float32, False, True)
    conv = F.conv2d(images.double() / 255, weight.double(), bias.double(), padding=1)
    pooled, index = F.max_pool2d(conv, 2, return_indices=True)
    row, col = index // conv.shape[3], index % conv.shape[3]
    want = torch.where(pooled > 0, 2 * (row % 2) + col % 2, 4)
    assert code.shape == (2 * 5 * 7,) and code.dtype == torch.int32  # byte c: channel c
    got = torch.stack([(code >> (8 * c)) & 0xFF for c in range(4)], dim=1)
    assert torch.equal(got.long(), want.permute(0, 2, 3, 1).reshape(-1, 4))
    assert first_block_op(images, weight, bias, torch.float32, False)[1].shape == (0,)


@pytest.mark.parametrize("change,message", [
    (lambda i, w, b: (i.float(), w, b), "takes uint8 images"),
    (lambda i, w, b: (i[:, :, :5], w, b), "H and W must be even"),
    (lambda i, w, b: (i, w[:3], b), "is Conv2d(1, 4, 3)"),
    (lambda i, w, b: (i, w.half(), b), "takes fp32 (or fp64) weight"),
])
def test_bad_inputs_are_one_clear_error(change, message):
    images, weight, bias = _inputs(1, 6, 6, "cpu")
    with pytest.raises(InputError, match=re.escape(message)):
        first_block(*change(images, weight, bias))


@pytest.mark.parametrize("device", DEVICES)
@KEEP_CODE
def test_programs_that_walk_several_blocks_give_the_same_gradients(device, monkeypatch,
                                                                    keep_code):
    """Both backwards are persistent: with fewer programs than blocks each program walks
    several (across images, and a partial last block of each), summing per lane."""
    import kernels.trunk.first_block as fb
    import kernels.trunk.first_block_bwd as code_bwd
    monkeypatch.setattr(fb, "BWD_PROGRAMS", 3)
    monkeypatch.setattr(fb, "BWD_BLOCK", 64)
    monkeypatch.setattr(code_bwd, "PROGRAMS", 3)
    monkeypatch.setattr(code_bwd, "BLOCK", 64)
    if device == "cuda":
        torch._dynamo.reset()
    _check_against_reference(*_inputs(3, 18, 34, device), torch.bfloat16, True, 1e-2,
                             keep_code)
