"""The third block's Triton forward (conv 16->64 -> bias -> 2x2 max-pool -> ReLU, and the
pool's code: --triton-conv-pool) against float64 with the same roundings, against the
--triton-pool graph it replaces, and its gradients (the pool's backward and cuDNN's)
against float64: odd sizes, one pooled pixel, more blocks than programs, both layouts,
bf16, fp16 and fp32; ties, dead ReLUs and NaN as max_pool2d and threshold_backward treat
them; opcheck; one clear error for bad inputs."""

import pytest
import torch
import torch.nn.functional as F

import kernels.trunk.conv_pool as conv_pool
from core.errors import InputError
from kernels.trunk.conv_pool import conv_pool_bias_relu, conv_pool_bias_relu_op, unfused
from tests.helpers import compiled_trunks_agree
from tests.reference import drawn_until, pool_windows, rel_err

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (B, H, W) of the 16-channel input: one pooled pixel, odd pooled sizes both ways.
SHAPES = [(1, 2, 2), (2, 6, 10), (3, 10, 6)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# A conv value's fp32 sum in another order than float64's can round to the neighbouring
# value of x's dtype (and then move a near-tie's pool choice): norm-relative bounds.
TOL = {torch.float32: 1e-6, torch.bfloat16: 4e-3, torch.float16: 1e-3}


def _inputs(shape, dtype, device, channels_last, seed=None, decisive=True):
    """Drawn from seed (a fresh one if None), then, where decisive, again while a pool or
    ReLU is not sure to decide as float64 does (_decides_alike). Not at the model's size:
    there no draw is sure (100 refused in a row, on an H100), and its checks are bounded
    for the windows that are not."""
    def draw(gen):
        x = torch.randn(shape[0], 16, *shape[1:], generator=gen).to(dtype)
        weight = torch.randn(64, 16, 3, 3, generator=gen) * 0.2
        return x, weight, torch.randn(64, generator=gen) * 0.5

    def alike(x, weight, bias):
        return _decides_alike(x, weight, bias, dtype)

    x, weight, bias = drawn_until(draw, alike if decisive else None, seed)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    return x.to(device), weight.to(device), bias.to(device)


# The kernel sums each conv value in fp32 (up to 9.4e-6 from float64 at these sizes, a CPU
# count) before the roundings _reference makes. Where that can move a window's choice or
# its ReLU (fp32: two values within it; bf16 and fp16: a rival value whose rounding it can
# change), the kernel may send a gradient elsewhere than float64: fp32's conv decided
# otherwise in 1-4 draws in 10,000 a case. Such draws are drawn again, as the first and
# second blocks' tests do.
NEAR = 2e-5


def _decides_alike(x, weight, bias, dtype) -> bool:
    """Whether every window's choice and ReLU over _reference's values stays the same for
    any conv value within NEAR of float64's. The roundings are monotone, so each value lies
    between those of conv - NEAR and conv + NEAR. Exact ties in the conv stay (equal
    inputs, equal sums in any order)."""
    w = weight.double().to(dtype).double()
    conv = F.conv2d(x.double(), w, None, padding=1)
    b = bias.double().to(dtype).double()[None, :, None, None]

    def pooled(c):
        return pool_windows((c.to(dtype).double() + b).to(dtype).double())

    c, v, lo, hi = pool_windows(conv), pooled(conv), pooled(conv - NEAR), pooled(conv + NEAR)
    first = (v == v.max(-1, keepdim=True).values).int().argmax(-1, keepdim=True)

    def chosen(t):
        return t.gather(-1, first)

    fixed = lo == hi  # a value no move within NEAR rounds otherwise
    rival = (hi >= chosen(lo)) & (c != chosen(c)) & ~(fixed & chosen(fixed))
    relu = (chosen(lo) <= 0) & (chosen(hi) > 0)
    return not bool(rival.any() or relu.any())


def _reference(x, weight, bias, dtype):
    """float64 autograd graph with the kernel's roundings: the weight and the conv's sum
    rounded to dtype, the bias added in dtype, max_pool2d's choice, relu."""
    w = weight.double().to(dtype).double()
    conv = F.conv2d(x.double(), w, None, padding=1).to(dtype).double()
    v = (conv + bias.double().to(dtype).double()[None, :, None, None]).to(dtype).double()
    return torch.relu(F.max_pool2d(v, 2))


def test_a_draw_whose_roundings_can_move_a_choice_is_drawn_again():
    """A bf16 draw that fp32's conv decides otherwise than float64 (found by a CPU count:
    2 draws in 10,000 at this size), on which test_conv_pool_bwd's dL/dx bound failed, is
    drawn again; a draw without one is kept."""
    def drawn(seed):
        gen = torch.Generator().manual_seed(seed)
        return torch.randn(2, 16, 6, 10, generator=gen).bfloat16()
    near, _, _ = _inputs((2, 6, 10), torch.bfloat16, "cpu", False, seed=349829734)
    far, _, _ = _inputs((2, 6, 10), torch.bfloat16, "cpu", False, seed=1)
    assert not torch.equal(near, drawn(349829734)) and torch.equal(far, drawn(1))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_forward_matches_float64_and_the_unfused_graph(device, shape, dtype, channels_last):
    x, weight, bias = _inputs(shape, dtype, device, channels_last)
    y = conv_pool_bias_relu(x, weight, bias)
    B, H, W = shape
    assert y.dtype == dtype and y.shape == (B, 64, H // 2, W // 2)
    assert y.stride() == unfused(x, weight, bias).stride()
    expected = _reference(x.cpu(), weight.cpu(), bias.cpu(), dtype)
    assert rel_err(y, expected) < TOL[dtype]
    # cuDNN runs an fp32 conv in TF32 where it may (torch's default), 2e-4 from float64
    # with the algorithms that autotuning picks: the graph it replaces in IEEE fp32, as
    # the kernel computes.
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        assert rel_err(y, unfused(x, weight, bias)) < TOL[dtype]
    if dtype != torch.float32:
        # Nearly every value bit for bit: rounding the sum once, not twice, would leave
        # about three quarters (measured: 0.63-0.83 of them).
        assert (y.cpu().double() == expected).float().mean().item() > 0.95


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_gradients_match_float64(device, dtype, channels_last):
    """The backward is cuDNN's, which computes fp32 in TF32 unless told not to (torch's
    default: 3e-4 from float64 on the H100): told not to here, as the forward's IEEE fp32."""
    x, weight, bias = _inputs((2, 6, 10), dtype, device, channels_last)
    x.requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    y = conv_pool_bias_relu(x, w, b)
    grad = torch.randn(y.shape).to(dtype)
    with torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        d_x, d_w, d_b = torch.autograd.grad(y, (x, w, b), grad.to(device))
    assert d_x.dtype == dtype and d_x.stride() == x.stride()
    assert d_w.dtype == d_b.dtype == torch.float32
    refs = [t.detach().cpu().double().requires_grad_(True) for t in (x, weight, bias)]
    expected = torch.autograd.grad(_reference(*refs, dtype), refs, grad.double())
    tol = {torch.float32: 1e-5, torch.bfloat16: 2e-2, torch.float16: 4e-3}[dtype]
    for actual, ref in zip((d_x, d_w, d_b), expected, strict=True):
        assert rel_err(actual, ref) < tol


@pytest.mark.parametrize("device", DEVICES)
def test_the_persistent_loop_covers_more_blocks_than_programs(device, monkeypatch):
    monkeypatch.setattr(conv_pool, "PROGRAMS", 3)
    monkeypatch.setattr(conv_pool, "BLOCK_P", 16)
    x, weight, bias = _inputs((3, 18, 22), torch.bfloat16, device, True)  # 297 pixels
    y = conv_pool_bias_relu(x, weight, bias)
    assert rel_err(y, _reference(x.cpu(), weight.cpu(), bias.cpu(), torch.bfloat16)) < \
        TOL[torch.bfloat16]


@pytest.mark.parametrize("device", DEVICES)
def test_ties_dead_relus_and_nan_as_the_pool_treats_them(device):
    """With only the centre tap of input channel 0, each conv value is that pixel: the
    pool test's windows (a four-way tie, a tie at d = 1 and 2, a dead window, a NaN), and
    the same outputs and gradients as the unfused graph, bit for bit."""
    weight = torch.zeros(64, 16, 3, 3)
    weight[:, 0, 1, 1] = 1.0
    bias = torch.zeros(64)
    bias[1] = -0.5
    x = torch.zeros(2, 16, 4, 6, dtype=torch.bfloat16)
    x[0, 0, :2, :2] = 1.0                                      # a four-way tie
    x[0, 0, :2, 2:4] = torch.tensor([[1.0, 2.0], [2.0, 0.5]])  # a tie at d = 1 and 2
    x[0, 0, 2:, :2] = -1.0                                     # dead
    x[1, 0, 2, 4] = float("nan")  # in another image: 0 x NaN spreads it to its neighbours
    x, weight, bias = x.to(device), weight.to(device), bias.to(device)
    x.requires_grad_(True)
    y, code = conv_pool_bias_relu_op(x, weight, bias)
    expected = unfused(x, weight, bias)
    assert torch.equal(y.isnan(), expected.isnan())
    assert torch.equal(y.nan_to_num(), expected.nan_to_num())
    assert code[0, 0] == 0 and code[1, 0] == 1 and code[3, 0] == 4  # pixels (0,0) (0,1) (1,0)
    assert y[1, :, 1, 2].isnan().all() and (code[6 + 5] == 4).all()  # image 1's pixel (1,2)
    grad = torch.ones_like(y)
    (d_x,) = torch.autograd.grad(y, x, grad)
    ref_x = x.detach().clone().requires_grad_(True)
    (r_x,) = torch.autograd.grad(unfused(ref_x, weight, bias), ref_x, grad)
    assert torch.equal(d_x, r_x)


def test_opcheck():
    x, weight, bias = _inputs((2, 4, 6), torch.float32, "cpu", True)
    torch.library.opcheck(conv_pool_bias_relu_op, (x.requires_grad_(True), weight, bias))


@pytest.mark.parametrize("bad,message", [
    (lambda: (torch.zeros(1, 8, 4, 4), torch.zeros(64, 16, 3, 3), torch.zeros(64)),
     r"x \[B, 16, H, W\]"),
    (lambda: (torch.zeros(1, 16, 4, 4, dtype=torch.float64), torch.zeros(64, 16, 3, 3),
              torch.zeros(64)), "fp32, bf16 or fp16"),
    (lambda: (torch.zeros(1, 16, 3, 4), torch.zeros(64, 16, 3, 3), torch.zeros(64)),
     "H and W must be even"),
    (lambda: (torch.zeros(1, 16, 4, 4), torch.zeros(64, 16, 5, 5), torch.zeros(64)),
     "weight must be"),
    (lambda: (torch.zeros(1, 16, 4, 4), torch.zeros(64, 16, 3, 3), torch.zeros(32)),
     "bias must be"),
])
def test_bad_inputs_fail_in_one_line(bad, message):
    with pytest.raises(InputError, match=message):
        conv_pool_bias_relu(*bad())


@pytest.mark.gpu
def test_the_model_size_matches_the_unfused_graph():
    """At the GPU preset's size (B=64 of its [16, 64, 64] inputs), bf16 NHWC: the same
    values as cuDNN's conv and the pool kernel but where the sum's order moves a rounding."""
    x, weight, bias = _inputs((64, 64, 64), torch.bfloat16, "cuda", True, decisive=False)
    y = conv_pool_bias_relu(x, weight, bias)
    expected = unfused(x, weight, bias)
    assert (y == expected).float().mean().item() > 0.99
    assert rel_err(y, expected) < 1e-3


@pytest.mark.gpu
def test_the_compiled_trunk_is_the_same_with_the_fused_forward():
    """The trunk as the step compiles it (--triton-pool on), with and without the third
    block's fused forward: output and gradients within bf16 rounding."""
    compiled_trunks_agree("triton_conv_pool")
