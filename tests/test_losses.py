"""Every strategy's loss and gradient against the independent float64 reference."""

import pytest
import torch

import losses
from tests.cases import KINDS, make_case
from tests.reference import grad_floor, reference_loss, rel_err

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Kernels and PyTorch strategies compute in fp32; gradients come back in the predictions'
# dtype, so bf16/fp16 gradients carry their rounding (2^-8, 2^-11 relative).
GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3,
            torch.float64: 1e-10}
LOSS_TOL = 1e-5
STRATEGIES = ("loop", "concat", "padded", "kernel", "conditional")


def targets_for(name, case):
    return case.targets if name in ("loop", "concat") else (case.boxes, case.counts)


def check_against_reference(strategy, case, device="cpu"):
    case = case.to(device)
    pred = case.pred.clone().requires_grad_(True)
    upstream = float(torch.empty(()).uniform_(0.5, 2.0)) * 256  # exercises grad_loss
    loss = strategy.loss(pred, targets_for(strategy.name, case))
    (loss * upstream).backward()
    ref_loss, ref_grad = reference_loss(case.pred, case.boxes, case.counts)
    where = f"{strategy.name} seed={case.seed} dtype={case.pred.dtype}"
    assert loss.dim() == 0 and torch.isfinite(loss), where
    assert rel_err(loss, ref_loss, floor=1.0) < LOSS_TOL, where
    assert pred.grad.dtype == case.pred.dtype, where
    tol = GRAD_TOL[case.pred.dtype]
    floor = grad_floor(upstream, case.counts)
    assert rel_err(pred.grad, ref_grad * upstream, floor) < tol, where


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", KINDS)
def test_strategy_matches_reference(name, dtype, kind):
    check_against_reference(losses.get(name), make_case(kind, B=5, M=16, dtype=dtype))


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("counts", ("empty", "full"))
def test_empty_and_full_batches(name, counts):
    """A batch without boxes: loss 0, zero gradient, never NaN. All 256 slots valid."""
    case = make_case("mixed", B=3, M=256, dtype=torch.bfloat16, counts=counts)
    strategy = losses.get(name)
    if counts == "full":
        check_against_reference(strategy, case)
        return
    pred = case.pred.clone().requires_grad_(True)
    loss = strategy.loss(pred, targets_for(name, case))
    loss.backward()
    assert loss.item() == 0.0
    assert torch.equal(pred.grad, torch.zeros_like(pred))


def test_giou_is_one_minus_giou_with_clamped_intersection():
    """Known values: identical boxes lose 0; disjoint boxes get no intersection."""
    from losses.giou import giou_loss_terms
    same = torch.tensor([[10.0, 10.0, 20.0, 20.0]])
    assert giou_loss_terms(same, same).item() == pytest.approx(0.0, abs=1e-6)
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[20.0, 20.0, 30.0, 30.0]])  # both extents negative: I must be 0
    hull, union = 900.0, 200.0
    assert giou_loss_terms(a, b).item() == pytest.approx(1 + (hull - union) / hull, rel=1e-6)


def test_unknown_strategy_lists_the_known_ones():
    with pytest.raises(Exception, match="loop, concat, padded, kernel, conditional"):
        losses.get("nope")


@pytest.mark.parametrize("name", STRATEGIES)
def test_bad_shapes_are_clear_errors(name):
    from errors import UserError
    case = make_case("random", B=2, M=8, dtype=torch.float32)
    strategy = losses.get(name)
    with pytest.raises(UserError, match="predictions must be"):
        strategy.loss(case.pred[..., :3], targets_for(name, case))
    with pytest.raises(UserError):
        strategy.loss(case.pred[:1], targets_for(name, case))
