"""--bf16-shadow: the shadow SGD kernel against a float64 reference of torch's SGD, and a
model with a bf16 lin1 weight and fp32 master weights giving the baseline's loss, gradient
and update under bf16 autocast."""

import pytest
import torch

import losses
from core.errors import InputError
from data import SyntheticFaces
from kernels.lin1.shadow_sgd import shadow_sgd_step
from tests.helpers import model_with
from training.optimizer import MOMENTUM

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 4097, 10_000])
def test_two_steps_match_sgd_in_float64(device, n):
    master = torch.randn(n, device=device)
    grads = [torch.randn(n, device=device).bfloat16() for _ in range(2)]
    buf = torch.full((n,), float("nan"), device=device)  # the first step must not read it
    shadow = torch.empty(n, dtype=torch.bfloat16, device=device)
    ref_p, ref_buf, bound, buf_bound = master.double().cpu(), None, 0.0, 0.0
    for step, g in enumerate(grads):
        shadow_sgd_step(master, g, buf, shadow, 0.01, MOMENTUM, first=step == 0)
        g64 = g.double().cpu()
        buf_bound = 0.0 if ref_buf is None else \
            buf_bound + 1e-6 * (MOMENTUM * ref_buf.abs() + g64.abs())
        ref_buf = g64 if ref_buf is None else MOMENTUM * ref_buf + g64
        # fp32 rounding is relative to the operands, not to the difference (one element
        # can cancel to near 0), and the steps' errors add up: |error| <= the sum over the
        # steps so far of 1e-6 * (|p| + lr * |buf|), elementwise.
        bound = bound + 1e-6 * (ref_p.abs() + 0.01 * ref_buf.abs())
        ref_p = ref_p - 0.01 * ref_buf
        assert ((master.double().cpu() - ref_p).abs() <= bound).all()
        assert ((buf.double().cpu() - ref_buf).abs() <= buf_bound).all()
        assert torch.equal(shadow, master.bfloat16())


def test_bad_tensors_are_one_clear_error():
    m = torch.zeros(4)
    with pytest.raises(InputError, match="one shape"):
        shadow_sgd_step(m, torch.zeros(5).bfloat16(), m.clone(), m.bfloat16(), 0.1, 0.9, True)
    with pytest.raises(InputError, match="fp32 master"):
        shadow_sgd_step(m.double(), m.bfloat16(), m.clone(), m.bfloat16(), 0.1, 0.9, True)


def _one_step(seed, shadow: bool, device="cpu"):
    model, optimizer = model_with({"bf16_shadow"} if shadow else set(), 32, 16, 64, seed,
                                  device, lr=0.5)
    strategy = losses.get("padded", capacity=16)
    dataset = SyntheticFaces(100, 32, seed)
    images, (boxes, counts) = strategy.collate([dataset[i] for i in range(6)])
    values = []
    for _ in range(2):  # the first step (momentum = gradient) and a later one
        with torch.autocast(device, dtype=torch.bfloat16):
            pred = model(images.to(device))
        loss = strategy.loss(pred, (boxes.to(device), counts.to(device)))
        loss.backward()
        grad = model.lin1.weight.grad.float().clone()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        values.append((loss.detach().float(), grad))
    weight = model.lin1_master if shadow else model.lin1.weight.detach()
    return values, weight.clone(), model.lin1.weight.dtype


def test_a_shadowed_model_takes_the_baselines_steps_under_autocast():
    seed = torch.randint(0, 2**31, ()).item()
    base, base_weight, base_dtype = _one_step(seed, shadow=False)
    shadow, shadow_weight, shadow_dtype = _one_step(seed, shadow=True)
    assert base_dtype == torch.float32 and shadow_dtype == torch.bfloat16
    for (loss0, grad0), (loss1, grad1) in zip(base, shadow, strict=True):
        torch.testing.assert_close(loss1, loss0, rtol=1e-3, atol=1e-5)
        # A product, not a ratio: six images without a box (1 draw in 2,700) give zero
        # gradients, which must stay zero.
        assert (grad1 - grad0).norm() <= 1e-2 * grad0.norm(), f"seed {seed}"
    assert ((shadow_weight - base_weight).norm() / base_weight.norm()).item() < 1e-4
