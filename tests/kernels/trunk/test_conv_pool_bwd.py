"""The third block's Triton backward (--triton-conv-pool-bwd: the input, weight and bias
gradients from the pooled gradient and the forward's code) against float64 with the
unfused graph's roundings and against the backward it replaces (the pool's kernel, then
cuDNN's or ATen's convolution backward): odd sizes, one pooled pixel, more blocks than
programs, both layouts, bf16, fp16 and fp32; ties, dead ReLUs and NaN; no input gradient
asked for; opcheck; one clear error for bad inputs."""

import pytest
import torch

import kernels.trunk.conv_pool_bwd as conv_pool_bwd
from core.errors import InputError
from kernels.trunk.conv_pool import conv_pool_bias_relu, conv_pool_bias_relu_op
from kernels.trunk.conv_pool_bwd import conv_pool_backward
from tests.helpers import compiled_trunks_agree
from tests.kernels.trunk.test_conv_pool import _inputs, _reference
from tests.reference import rel_err

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
SHAPES = [(1, 2, 2), (2, 6, 10), (3, 10, 6)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Norm-relative bounds against float64. dL/dx is rounded once to x's dtype (the reference
# keeps it in float64: up to 1.9e-3 in bf16, 2.4e-4 in fp16 over 54 random cases); dL/dw
# and dL/dbias are rounded to x's dtype in both (up to 8e-6). The backward it replaces
# (ATen's on the CPU, rounding bf16 more often) differs from it by up to 4.5e-3 in bf16:
# the looser bound there.
TOL = {torch.float32: (1e-6, 1e-6), torch.bfloat16: (3e-3, 1e-3),
       torch.float16: (4e-4, 1e-4)}
TOL_OLD = 1e-2


def _grads(x, weight, bias, grad, triton_backward, wanted=(True, True, True)):
    leaves = [t.detach().clone().requires_grad_(w) for t, w in zip((x, weight, bias), wanted,
                                                                    strict=True)]
    y = conv_pool_bias_relu(*leaves, triton_backward)
    return torch.autograd.grad(y, [t for t in leaves if t.requires_grad], grad)


def _float64(x, weight, bias, grad, dtype):
    refs = [t.detach().cpu().double().requires_grad_(True) for t in (x, weight, bias)]
    return torch.autograd.grad(_reference(*refs, dtype), refs, grad.cpu().double())


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_gradients_match_float64_and_the_backward_it_replaces(device, shape, dtype,
                                                              channels_last):
    x, weight, bias = _inputs(shape, dtype, device, channels_last)
    if channels_last:
        weight = weight.to(memory_format=torch.channels_last)  # as the model's
    B, H, W = shape
    grad = torch.randn(B, 64, H // 2, W // 2).to(dtype).to(device)
    got = _grads(x, weight, bias, grad, True)
    old = _grads(x, weight, bias, grad, False)
    expected = _float64(x, weight, bias, grad, dtype)
    tol_x, tol_w = TOL[dtype]
    for actual, before, ref, tol in zip(got, old, expected, (tol_x, tol_w, tol_w),
                                        strict=True):
        assert actual.dtype == before.dtype and actual.stride() == before.stride()
        assert rel_err(actual, ref) < tol
        assert rel_err(actual, before) < TOL_OLD


@pytest.mark.parametrize("device", DEVICES)
def test_the_persistent_loops_cover_more_blocks_than_programs(device, monkeypatch):
    monkeypatch.setattr(conv_pool_bwd, "PROGRAMS", 3)
    monkeypatch.setattr(conv_pool_bwd, "XGRAD_BLOCK", 16)
    monkeypatch.setattr(conv_pool_bwd, "WGRAD_BLOCK", 16)
    x, weight, bias = _inputs((3, 18, 22), torch.bfloat16, device, True)  # 297 pixels
    grad = torch.randn(3, 64, 9, 11).to(torch.bfloat16).to(device)
    got = _grads(x, weight, bias, grad, True)
    expected = _float64(x, weight, bias, grad, torch.bfloat16)
    for actual, ref, tol in zip(got, expected, TOL[torch.bfloat16] + (1e-3,), strict=True):
        assert rel_err(actual, ref) < tol


@pytest.mark.parametrize("device", DEVICES)
def test_ties_dead_relus_and_nan_as_the_backward_it_replaces(device):
    """The forward test's windows (a four-way tie, a tie at d = 1 and 2, a dead window, a
    NaN) with only the centre tap of input channel 0: small integers, so every sum is
    exact and both backwards agree bit for bit, NaNs where they fall included."""
    weight = torch.zeros(64, 16, 3, 3)
    weight[:, 0, 1, 1] = 1.0
    bias = torch.zeros(64)
    bias[1] = -0.5
    x = torch.zeros(2, 16, 4, 6, dtype=torch.bfloat16)
    x[0, 0, :2, :2] = 1.0
    x[0, 0, :2, 2:4] = torch.tensor([[1.0, 2.0], [2.0, 0.5]])
    x[0, 0, 2:, :2] = -1.0
    x[1, 0, 2, 4] = float("nan")
    x, weight, bias = x.to(device), weight.to(device), bias.to(device)
    grad = torch.ones(2, 64, 2, 3, dtype=torch.bfloat16, device=device)
    for actual, before in zip(_grads(x, weight, bias, grad, True),
                              _grads(x, weight, bias, grad, False), strict=True):
        assert torch.equal(actual.isnan(), before.isnan())
        assert torch.equal(actual.nan_to_num(), before.nan_to_num())


@pytest.mark.parametrize("device", DEVICES)
def test_without_an_input_gradient_only_the_parameters_get_one(device):
    x, weight, bias = _inputs((2, 6, 10), torch.bfloat16, device, True)
    grad = torch.randn(2, 64, 3, 5).to(torch.bfloat16).to(device)
    d_w, d_b = _grads(x, weight, bias, grad, True, wanted=(False, True, True))
    _, r_w, r_b = _float64(x, weight, bias, grad, torch.bfloat16)
    assert rel_err(d_w, r_w) < 1e-3 and rel_err(d_b, r_b) < 1e-3


def test_opcheck():
    x, weight, bias = _inputs((2, 4, 6), torch.float32, "cpu", True)
    _, code = conv_pool_bias_relu_op(x, weight, bias)
    grad = torch.randn(2, 64, 2, 3).to(memory_format=torch.channels_last)
    torch.library.opcheck(conv_pool_backward, (grad, code, x, weight, True))
    torch.library.opcheck(conv_pool_bias_relu_op,
                          (x.requires_grad_(True), weight.requires_grad_(True), bias, True))


def _backward_inputs():
    x = torch.zeros(1, 16, 4, 4)
    return torch.zeros(1, 64, 2, 2), torch.zeros(4, 64, dtype=torch.int8), x, \
        torch.zeros(64, 16, 3, 3)


@pytest.mark.parametrize("change,message", [
    (lambda g, c, x, w: (g.bfloat16(), c, x, w), "gradient must be torch.float32"),
    (lambda g, c, x, w: (g, c[:3], x, w), "code must be the forward's"),
    (lambda g, c, x, w: (g, c.float(), x, w), "code must be the forward's"),
    (lambda g, c, x, w: (g, c, x[:, :8], w), r"x \[B, 16, H, W\]"),
    (lambda g, c, x, w: (g, c, x, w[:32]), "weight must be"),
])
def test_bad_inputs_fail_in_one_line(change, message):
    with pytest.raises(InputError, match=message):
        conv_pool_backward(*change(*_backward_inputs()), True)


@pytest.mark.gpu
def test_the_model_size_matches_the_backward_it_replaces():
    """At the GPU preset's size (B=64 of its [16, 64, 64] inputs), bf16 NHWC: the same
    gradients as the pool's kernel and cuDNN's but where the sums' order moves a
    rounding, and within bf16 rounding of float64. Each weight's gradient sums 262,144
    products in fp32 here, so its order moves many bf16 roundings by a step: dL/dw and
    dL/dbias are held to one bf16 step (2^-8, norm-relative), where the small shapes'
    1e-3 failed once in a fresh draw on an H200 (1.41e-3)."""
    x, weight, bias = _inputs((64, 64, 64), torch.bfloat16, "cuda", True, decisive=False)
    weight = weight.to(memory_format=torch.channels_last)
    grad = torch.randn(64, 64, 32, 32, device="cuda").to(torch.bfloat16)
    grad = grad.to(memory_format=torch.channels_last)
    got = _grads(x, weight, bias, grad, True)
    old = _grads(x, weight, bias, grad, False)
    expected = _float64(x, weight, bias, grad, torch.bfloat16)
    step = 2.0 ** -8
    for actual, before, ref, tol in zip(got, old, expected,
                                        (TOL[torch.bfloat16][0], step, step), strict=True):
        assert rel_err(actual, ref) < tol and rel_err(actual, before) < TOL_OLD


@pytest.mark.gpu
def test_the_compiled_trunk_is_the_same_with_the_triton_backward():
    """The trunk as the step compiles it (--triton-conv-pool on), with and without the
    third block's Triton backward: output and gradients within bf16 rounding."""
    compiled_trunks_agree("triton_conv_pool_bwd", "triton_conv_pool")

