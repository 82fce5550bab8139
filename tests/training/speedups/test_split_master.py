"""--split-master: lin1's fp32 master as its bf16 weight, an int16 low half and a tie bit.
The halves hold the master exactly, the weight is torch's rounding of it, and the shadow
SGD on the halves takes --bf16-shadow's steps bit for bit: the same masters, weights,
momentum and losses."""

import pytest
import torch

import train
from core.errors import InputError
from kernels.lin1.master_halves import join, split
from kernels.lin1.shadow_sgd import shadow_sgd_step
from tests.helpers import floats_of_bits, resolved, shadow_steps
from training import speedups
from training.optimizer import MOMENTUM

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
# Bit patterns that break a split: ties rounded down (even high half) and up (odd), both
# signs; a rounding up across a binade, up to inf; zeros; the smallest subnormals, one a tie.
EDGES = [0x3F808000, 0xBF808000, 0x3F818000, 0xBF818000, 0x3F7FFFFF, 0xBF7FFFFF,
         0x7F7FFFFF, 0x00000000, 0x80000000, 0x00000001, 0x80000001, 0x00008000,
         0x3F80FFFF, 0x3F807FFF]


def _masters(n: int, device="cpu") -> torch.Tensor:
    """Fresh random fp32 values over 12 decades and both signs, then the edges."""
    values = torch.randn(n) * torch.logspace(-6, 6, n)[torch.randperm(n)]
    return torch.cat([values, floats_of_bits(EDGES)]).to(device)


def _ties_rounded_down(master: torch.Tensor) -> torch.Tensor:
    bits = master.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    return ((bits & 0xFFFF) == 0x8000) & ((bits >> 16) & 1 == 0)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit: -0.0 is not 0.0, and a NaN (the largest masters overflow) is itself."""
    kind = torch.int16 if a.element_size() == 2 else torch.int32
    return a.dtype == b.dtype and torch.equal(a.view(kind), b.view(kind))


@pytest.mark.parametrize("device", DEVICES)
def test_the_halves_hold_the_master_and_its_rounding(device):
    master = _masters(50_000, device)
    weight, low, ties = split(master)
    assert weight.dtype == torch.bfloat16 and low.dtype == torch.int16
    assert torch.equal(weight, master.bfloat16())
    assert _same_bits(join(weight, low, ties), master)
    # The tie bits: one word for 32 elements, set where a tie rounded down, alone.
    bits = [(int(w) >> k) & 1 for w in ties.cpu() for k in range(32)][:master.numel()]
    assert torch.equal(torch.tensor(bits, dtype=torch.bool), _ties_rounded_down(master).cpu())
    assert sum(bits) >= 3


@pytest.mark.parametrize("device", DEVICES)
def test_a_matrix_keeps_its_rows_bits_in_its_own_words(device):
    """training/parallel.py cuts the tie bits by rows where it cuts the weight."""
    master = _masters(4 * 96 - len(EDGES), device).view(4, 96)
    weight, low, ties = split(master)
    assert ties.shape == (4, 3)
    for r in range(4):
        assert _same_bits(join(weight[r], low[r], ties[r]), master[r])
    with pytest.raises(ValueError, match="32 elements a word"):
        split(torch.zeros(2, 48, device=device))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("n", [1, 4097, 10_000])
def test_the_kernel_on_the_halves_takes_the_fp32_masters_steps(device, n):
    """Four steps on both forms from one master, a fresh gradient each, some of it zero
    (a master that stays on its tie), some of it under one ulp of the master (a master
    that leaves its tie by less than the one-ulp move a tie bit saves): the same master,
    momentum and bf16 weight, bit for bit."""
    master = _masters(n, device)[-n:]
    weight, low, ties = split(master)
    shadow, buf, buf_split = master.bfloat16(), torch.empty_like(master), \
        torch.empty_like(master)
    for step in range(4):
        g = torch.randn(master.numel(), device=device)
        g = torch.where(torch.rand_like(g) < 0.3, 0.0, g)
        scale = torch.where(torch.rand_like(g) < 0.3, master.abs() * 2**-22, 1e-2)
        g = (g * scale / 0.01).bfloat16()  # lr 0.01: updates of about one ulp, and 1e-2
        shadow_sgd_step(master, g, buf, shadow, 0.01, MOMENTUM, first=step == 0)
        shadow_sgd_step(low, g, buf_split, weight, 0.01, MOMENTUM, first=step == 0,
                        ties=ties)
        assert _same_bits(buf_split, buf)
        assert _same_bits(weight, shadow)
        assert _same_bits(join(weight, low, ties), master)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("reach", [2.0**-20, 2.0**-5])
def test_skipping_unchanged_weights_stores_the_same_bits(device, reach):
    """--skip-unchanged-weight's store under a mask: from one state, three steps with and
    without it give the same weight, low half, tie bits and momentum, bit for bit, where
    updates of 2^-20 of a master leave most bf16 weights as they were (what the mask
    skips) and where updates of 2^-5 move most (what it still stores)."""
    n = 10_000
    first = split(_masters(n, device)[-n:])
    states = [first, tuple(t.clone() for t in first)]
    bufs = [torch.empty(n, device=device) for _ in range(2)]
    size = join(*first).abs()
    for step in range(3):
        g = torch.randn(n, device=device) * size * reach / 0.01  # lr 0.01
        g = torch.where(torch.rand_like(g) < 0.3, 0.0, g).bfloat16()
        before = states[0][0].clone()
        for (weight, low, ties), buf, skip in zip(states, bufs, (False, True)):
            shadow_sgd_step(low, g, buf, weight, 0.01, MOMENTUM, first=step == 0, ties=ties,
                            skip_unchanged=skip)
        for a, b in zip((*states[0], bufs[0]), (*states[1], bufs[1])):
            assert _same_bits(a, b)
        moved = (states[0][0].view(torch.int16) != before.view(torch.int16)).float().mean()
        assert (moved < 0.1) if reach < 2**-10 else (moved > 0.5)


def test_skipping_unchanged_weights_is_idle_without_the_split_master():
    base = {**speedups.baseline_values(), "bf16_shadow": True, "skip_unchanged_weight": True}
    alone = resolved(train.Config(**base), cuda=True)
    assert not alone["on"]["skip_unchanged_weight"]
    both = resolved(train.Config(**{**base, "split_master": True}), cuda=True)
    assert both["on"]["skip_unchanged_weight"]


@pytest.mark.parametrize("beside", [False, True])
def test_a_split_model_takes_the_shadowed_models_steps(beside):
    seed = torch.randint(0, 2**31, ()).item()
    names = {"bf16_shadow"} | ({"lin1_update_beside_trunk"} if beside else set())
    losses0, model0, opt0 = shadow_steps(names, seed)
    for more in ({"split_master"}, {"split_master", "skip_unchanged_weight"}):
        losses1, model1, opt1 = shadow_steps(names | more, seed)
        assert not hasattr(model1, "lin1_master")
        assert model1.lin1_master_low.dtype == torch.int16
        assert opt1.skip_unchanged_weight == ("skip_unchanged_weight" in more)
        assert torch.equal(losses1, losses0)
        assert torch.equal(model1.lin1.weight, model0.lin1.weight)
        assert torch.equal(opt1.buffers[0], opt0.buffers[0])
        held = join(model1.lin1.weight.detach(), model1.lin1_master_low,
                    model1.lin1_master_ties)
        assert _same_bits(held, model0.lin1_master)


def test_it_is_idle_without_the_shadow_and_on_with_it():
    base = speedups.baseline_values()
    alone = resolved(train.Config(**{**base, "split_master": True}), cuda=True)
    assert not alone["on"]["split_master"]
    both = resolved(train.Config(**{**base, "split_master": True,
                                            "bf16_shadow": True}), cuda=True)
    assert both["on"]["split_master"]


def test_bad_halves_are_one_clear_error():
    with pytest.raises(TypeError, match="fp32 master"):
        split(torch.zeros(3, dtype=torch.float64))
    with pytest.raises(TypeError, match="int16 low half"):
        join(torch.zeros(3, dtype=torch.bfloat16), torch.zeros(4, dtype=torch.int16),
             torch.zeros(1, dtype=torch.int32))
    m = torch.zeros(64)
    with pytest.raises(InputError, match="tie bits"):
        shadow_sgd_step(split(m)[1], m.bfloat16(), m.clone(), m.bfloat16(), 0.1, 0.9, True)
    with pytest.raises(InputError, match="tie bits"):
        shadow_sgd_step(m, m.bfloat16(), m.clone(), m.bfloat16(), 0.1, 0.9, True,
                        ties=torch.zeros(2, dtype=torch.int32))
