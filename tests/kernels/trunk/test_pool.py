"""The Triton pool (bias -> 2x2 max-pool -> ReLU after a bias-free conv, --triton-pool)
against the unfused graph it replaces, and its gradients against float64: bit for bit in
the forward (the bias rounded to x's dtype before the max, as the unfused graph adds it),
ties and dead ReLUs as max_pool2d and threshold_backward treat them, odd sizes, channel
counts that are not a multiple of the block, both layouts, the flattened output, bf16,
fp16 and fp32; opcheck; one clear error for bad inputs."""

import pytest
import torch
import torch.nn.functional as F

from core.errors import InputError
from kernels.trunk.pool import BLOCK_C, pool_bias_relu, pool_bias_relu_op
from tests.helpers import compiled_trunks_agree
from tests.reference import rel_err

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# (B, C, H, W): one pooled pixel, channels below and above a block, odd pooled sizes.
SHAPES = [(1, 3, 2, 2), (2, 64, 6, 10), (3, BLOCK_C + 5, 10, 6), (1, 256, 8, 8)]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _inputs(shape, dtype, device, channels_last, seed=None):
    gen = torch.Generator().manual_seed(seed if seed is not None
                                        else torch.randint(0, 2**31, ()).item())
    x = torch.randn(shape, generator=gen).to(dtype)
    bias = torch.randn(shape[1], generator=gen) * 0.5
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    return x.to(device), bias.to(device)


def _unfused(x, bias):
    """What the model ran before: the conv's bias added in x's dtype (autocast's cast),
    then max_pool2d and relu."""
    return torch.relu(F.max_pool2d(x + bias.to(x.dtype)[None, :, None, None], 2))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last,flat", [(False, False), (True, False), (True, True)])
def test_forward_is_the_unfused_graph_bit_for_bit(device, shape, dtype, channels_last, flat):
    x, bias = _inputs(shape, dtype, device, channels_last)
    y = pool_bias_relu(x, bias, flat)
    assert y.dtype == dtype and y.shape == (shape[0], shape[1], shape[2] // 2, shape[3] // 2)
    nhwc = channels_last and not flat and x.shape[1] > 1
    assert y.is_contiguous(memory_format=torch.channels_last if nhwc else
                           torch.contiguous_format)
    assert torch.equal(y.cpu(), _unfused(x.cpu(), bias.cpu()))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels_last", [False, True])
def test_gradients_match_float64(device, shape, dtype, channels_last):
    """dL/dx is the upstream gradient routed to each window's maximum (exact: a copy);
    dL/dbias its sum in fp32, rounded to x's dtype as the cast's backward rounds it."""
    x, bias = _inputs(shape, dtype, device, channels_last)
    x.requires_grad_(True)
    b = bias.clone().requires_grad_(True)
    y = pool_bias_relu(x, b, flat=channels_last)
    grad = torch.randn(y.shape, dtype=torch.float64).to(dtype)
    d_x, d_b = torch.autograd.grad(y, (x, b), grad.to(device))
    x64 = x.detach().cpu().requires_grad_(True)
    b64 = bias.detach().cpu().double().requires_grad_(True)
    # The reference's routing is max_pool2d's on the same rounded values; its sums are
    # float64.
    v = (x64.double() + b64.to(dtype).double()[None, :, None, None]).to(dtype).double()
    ref = torch.relu(F.max_pool2d(v, 2))
    r_x, r_b = torch.autograd.grad(ref, (x64, b64), grad.double())
    assert d_x.dtype == dtype and d_x.stride() == x.stride()
    assert d_b.dtype == bias.dtype
    assert torch.equal(d_x.cpu().double(), r_x.double())
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    assert rel_err(d_b.cpu(), r_b) < tol


@pytest.mark.parametrize("device", DEVICES)
def test_ties_go_to_the_first_and_dead_relus_get_no_gradient(device):
    # Windows of equal values (before and after the bias), all-negative windows, zeros,
    # and a pair that only the bias's rounding makes equal.
    x = torch.zeros(1, 2, 4, 4, dtype=torch.bfloat16)
    x[0, 0, :2, :2] = 1.0                      # a four-way tie: the first wins
    x[0, 0, :2, 2:] = torch.tensor([[1.0, 2.0], [2.0, 0.5]])  # a tie at d = 1 and 2
    x[0, 0, 2:, :2] = -1.0                     # dead after the bias
    x[0, 1, :2, :2] = torch.tensor([[256.0, 257.0], [0.0, 0.0]])  # 257 = 256 + 1 ulp
    bias = torch.tensor([-0.5, 1.0])           # 256 + 1 and 257 + 1 round to 258 in bf16
    x, bias = x.to(device), bias.to(device)
    x.requires_grad_(True)
    y = pool_bias_relu(x, bias)
    assert torch.equal(y.cpu().float(), _unfused(x.detach().cpu(), bias.cpu()).float())
    (d_x,) = torch.autograd.grad(y, x, torch.ones_like(y))
    ref_x = x.detach().cpu().requires_grad_(True)
    (r_x,) = torch.autograd.grad(_unfused(ref_x, bias.cpu()), ref_x,
                                 torch.ones_like(y).cpu())
    assert torch.equal(d_x.cpu(), r_x)
    assert d_x[0, 0, 0, 0] == 1 and d_x[0, 0, :2, :2].sum() == 1
    assert d_x[0, 0, 0, 3] == 1 and d_x[0, 0, 1, 2] == 0
    assert d_x[0, 0, 2:, :2].abs().sum() == 0
    assert d_x[0, 1, 0, 0] == 1 and d_x[0, 1, 0, 1] == 0  # the rounding's tie: the first


@pytest.mark.parametrize("device", DEVICES)
def test_nan_propagates_and_passes_no_gradient(device):
    x = torch.zeros(1, 1, 2, 2)
    x[0, 0, 1, 0] = float("nan")
    x = x.to(device).requires_grad_(True)
    y = pool_bias_relu(x, torch.ones(1, device=device))
    assert torch.isnan(y).all()
    (d_x,) = torch.autograd.grad(y, x, torch.ones_like(y))
    assert d_x.abs().sum() == 0


def test_opcheck():
    x, bias = _inputs((2, 5, 4, 6), torch.float32, "cpu", True, seed=0)
    torch.library.opcheck(pool_bias_relu_op, (x.requires_grad_(True), bias, False))


@pytest.mark.parametrize("bad,message", [
    (lambda: (torch.zeros(1, 2, 3, 4), torch.zeros(2)), "H and W must be even"),
    (lambda: (torch.zeros(1, 2, 4, 4), torch.zeros(3)), "bias must be"),
    (lambda: (torch.zeros(2, 4, 4), torch.zeros(2)), "conv output"),
    (lambda: (torch.zeros(1, 2, 4, 4, dtype=torch.int32), torch.zeros(2)), "conv output"),
])
def test_bad_inputs_fail_in_one_line(bad, message):
    with pytest.raises(InputError, match=message):
        pool_bias_relu(*bad())


@pytest.mark.gpu
def test_the_compiled_trunk_is_the_same_with_the_pool_kernel():
    """The trunk as the step compiles it, bf16 autocast, NHWC, at the GPU preset's image
    size: the same output and gradients within bf16 rounding. (Compiled at the GPU
    preset's batch, Inductor adds the bias after cuDNN's conv as this kernel does, and the
    two trunks' outputs were equal bit for bit on the H100; at this batch cuDNN may add
    the bias in its conv, rounding once where Inductor rounds twice: 1 bf16 ulp apart in
    places on the H100.)"""
    compiled_trunks_agree("triton_pool")
