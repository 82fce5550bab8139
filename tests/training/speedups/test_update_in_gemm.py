"""--update-in-gemm: lin1's weight-gradient GEMM with the shadow SGD in its epilogue
(kernels/lin1/dw_update.py) against a float64 reference, the linear layer that leaves
its weight gradient to it (kernels/lin1/deferred_linear.py), a model taking the shadow SGD's
steps with it, and where the switch applies."""

import pytest
import torch
import torch.nn.functional as F

import losses
import train
from core.errors import InputError, UserError
from data import SyntheticFaces
from kernels.lin1.deferred_linear import PendingGrad, deferred_linear
from kernels.lin1.dw_update import dw_update_step
from tests.helpers import model_with
from training import speedups
from training.optimizer import MOMENTUM

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
LR = 0.01


def _operands(kind, K, H, F_, device):
    dy = torch.randn(K, H, device=device)
    x = torch.randn(K, F_, device=device)
    if kind == "zeros":  # a batch whose gradient is 0 where no box is: rows of zeros
        dy[::2] = 0
        x[:, ::3] = 0
    elif kind == "wide":  # magnitudes far from 1, both ways
        dy = dy * torch.logspace(-6, 6, H, device=device)
        x = x * torch.logspace(4, -4, F_, device=device)
    return dy.bfloat16(), x.bfloat16()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("K,H,F_", [(1, 1, 1), (37, 45, 70), (64, 16, 16), (130, 33, 257)])
@pytest.mark.parametrize("kind", ["random", "zeros", "wide"])
def test_two_steps_match_the_gemm_and_sgd_in_float64(device, K, H, F_, kind):
    master = torch.randn(H, F_, device=device)
    buf = torch.full((H, F_), float("nan"), device=device)  # the first step must not read it
    weight = torch.empty(H, F_, dtype=torch.bfloat16, device=device)
    ref_p, ref_buf = master.double().cpu(), None
    bound, buf_bound = torch.zeros(H, F_, dtype=torch.float64), 0.0
    for step in range(2):
        dy, x = _operands(kind, K, H, F_, device)
        dw_update_step(dy, x, master, buf, weight, LR, MOMENTUM, first=step == 0)
        g64 = dy.double().cpu().T @ x.double().cpu()
        # The kernel rounds its fp32 sum to bf16, as cuBLAS's bf16 output does: within
        # one bf16 unit (2^-8 relative) of the exact sum, plus the fp32 sum's own error
        # (K terms of 2^-24 of the products' magnitudes).
        mags = dy.double().cpu().abs().T @ x.double().cpu().abs()
        g_err = 2.0 ** -8 * g64.abs() + K * 2.0 ** -23 * mags
        buf_bound = g_err + (0.0 if ref_buf is None else MOMENTUM * buf_bound +
                             1e-6 * (MOMENTUM * ref_buf.abs() + g64.abs()))
        ref_buf = g64 if ref_buf is None else MOMENTUM * ref_buf + g64
        bound = bound + LR * buf_bound + 1e-6 * (ref_p.abs() + LR * ref_buf.abs())
        ref_p = ref_p - LR * ref_buf
        assert ((buf.double().cpu() - ref_buf).abs() <= buf_bound + 1e-30).all()
        assert ((master.double().cpu() - ref_p).abs() <= bound + 1e-30).all()
        assert torch.equal(weight, master.bfloat16())  # the next forward's weight


@pytest.mark.parametrize("device", DEVICES)
def test_the_gradient_is_the_bf16_one_a_gemm_writes(device):
    """Exactly bf16(fp32 sum) where the sum is exact in fp32 (small integers): the update
    reads the gradient the step without the fusion reads, not an fp32 one."""
    K, H, F_ = 48, 20, 24
    dy = torch.randint(-3, 4, (K, H), device=device).bfloat16()
    x = torch.randint(-3, 4, (K, F_), device=device).bfloat16()
    x[0] = 0.00390625 * 3  # one term off the grid: sums that do not fit bf16's 8 bits
    master = torch.zeros(H, F_, device=device)
    buf = torch.empty_like(master)
    weight = torch.empty(H, F_, dtype=torch.bfloat16, device=device)
    dw_update_step(dy, x, master, buf, weight, 1.0, MOMENTUM, first=True)
    exact = (dy.float().T @ x.float())  # exact: integers and one small term, in fp32
    assert torch.equal(buf, exact.bfloat16().float())
    assert torch.equal(master, -exact.bfloat16().float())


def test_bad_operands_are_one_clear_error():
    dy, x = torch.zeros(4, 3).bfloat16(), torch.zeros(4, 5).bfloat16()
    m = torch.zeros(3, 5)
    w = m.bfloat16()
    with pytest.raises(InputError, match=r"dY \[K, H\] and X \[K, F\]"):
        dw_update_step(dy, x[:3], m, m.clone(), w, LR, MOMENTUM, True)
    with pytest.raises(InputError, match=r"of shape \(3, 5\)"):
        dw_update_step(dy, x, m[:2], m.clone(), w, LR, MOMENTUM, True)
    with pytest.raises(InputError, match="bf16 dY"):
        dw_update_step(dy.float(), x, m, m.clone(), w, LR, MOMENTUM, True)
    with pytest.raises(InputError, match="fp32 master"):
        dw_update_step(dy, x, m.double(), m.clone(), w, LR, MOMENTUM, True)
    with pytest.raises(InputError, match="contiguous"):
        dw_update_step(dy, x, m.t().contiguous().t(), m.clone(), w, LR, MOMENTUM, True)


def test_the_deferred_layer_gives_the_input_and_bias_gradients_and_leaves_dw():
    x0 = torch.randn(6, 10)
    weight = torch.randn(4, 10).bfloat16().requires_grad_()
    bias = torch.randn(4, requires_grad=True)
    grads = []
    for deferred in (False, True):
        x = x0.clone().requires_grad_()
        pending = PendingGrad()
        with torch.autocast("cpu", dtype=torch.bfloat16):
            inner = x * 2  # bf16 input to the layer, as the trunk's output is
            y = deferred_linear(inner.bfloat16(), weight, bias, pending) if deferred else \
                F.linear(inner.bfloat16(), weight, bias)
        (y.float() ** 2).sum().backward()
        grads.append((x.grad, bias.grad, weight.grad))
        weight.grad, bias.grad = None, None
        if deferred:
            dy, saved = pending.take()
            assert pending.take() is None  # taken once
            assert torch.equal(saved, (x0 * 2).bfloat16())
            assert torch.equal(dy, (2 * y.float()).bfloat16())
    (gx0, gb0, gw0), (gx1, gb1, gw1) = grads
    assert gw0 is not None and gw1 is None  # the weight's gradient is the optimizer's
    assert torch.equal(gx1, gx0) and gb1.dtype == torch.float32
    torch.testing.assert_close(gb1, gb0)


def _steps(seed, in_gemm: bool, steps=3):
    """Losses and lin1's master and momentum after `steps` steps of a small shadowed model
    under bf16 autocast on the CPU (the kernels in Triton's interpreter)."""
    names = {"bf16_shadow", "update_in_gemm"} if in_gemm else {"bf16_shadow"}
    model, optimizer = model_with(names, 32, 16, 64, seed, lr=0.5)
    assert getattr(model, "compile_whole", True) is not in_gemm
    strategy = losses.get("padded", capacity=16)
    dataset = SyntheticFaces(100, 32, seed)
    values = []
    for step in range(steps):
        images, (boxes, counts) = strategy.collate([dataset[6 * step + i] for i in range(6)])
        with torch.autocast("cpu", dtype=torch.bfloat16):
            pred = model(images)
        loss = strategy.loss(pred, (boxes, counts))
        loss.backward()
        assert (model.lin1.weight.grad is None) is in_gemm
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        values.append(loss.detach().float())
    return values, model.lin1_master.clone(), optimizer.buffers[0].clone(), model


def test_a_model_takes_the_shadow_sgds_steps_with_the_update_in_the_gemm():
    seed = torch.randint(0, 2**31, ()).item()
    losses0, master0, buf0, _ = _steps(seed, in_gemm=False)
    losses1, master1, buf1, model = _steps(seed, in_gemm=True)
    assert losses1[0] == losses0[0]  # the same forward before any update
    for l1, l0 in zip(losses1, losses0, strict=True):
        torch.testing.assert_close(l1, l0, rtol=1e-3, atol=1e-5)
    assert ((buf1 - buf0).norm() / buf0.norm()).item() < 1e-2  # bf16 gradients' rounding
    assert ((master1 - master0).norm() / master0.norm()).item() < 1e-4
    assert torch.equal(model.lin1.weight.detach(), master1.bfloat16())
    assert model.lin1.pending.take() is None  # each step took its operands


def test_auto_is_off_with_the_reason_where_it_cannot_apply(monkeypatch):
    assert train.parse_config(["--preset", "cpu"]).update_in_gemm == "off"  # the default
    cfg = train.parse_config(["--preset", "cpu", "--update-in-gemm", "auto"])
    used = speedups.resolve(cfg, cuda=False)
    assert used["on"]["update_in_gemm"] is False
    assert "--bf16-shadow's fp32 master" in used["update_in_gemm_off_because"]
    # The GPU preset's switches (parse_config refuses that preset without a GPU).
    gpu = ["--preset", "cpu", "--amp", "--bf16-shadow", "--update-in-gemm", "auto"]
    assert speedups.resolve(train.parse_config(gpu), cuda=True)["on"]["update_in_gemm"]
    forward = train.parse_config(gpu + ["--mode", "forward"])
    assert speedups.resolve(forward, cuda=True)["update_in_gemm_off_because"] == \
        "forward mode runs no update"
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    for design, words in (("ddp", "all-reduced"), ("zero", "reduce-scattered"),
                          ("tp", "DTensor")):
        cfg = train.parse_config(gpu + ["--parallel", design])
        used = speedups.resolve(cfg, cuda=True)
        assert used["on"]["update_in_gemm"] is False
        assert words in used["update_in_gemm_off_because"]
        assert "no update_in_gemm: with --parallel" in \
            speedups.describe_used(used)
        on = train.parse_config(gpu + ["--parallel", design, "--update-in-gemm", "on"])
        with pytest.raises(UserError, match=f"--update-in-gemm on: with --parallel {design}"):
            speedups.check(on, cuda=True)
