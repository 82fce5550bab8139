"""Every strategy's loss and gradient against the independent float64 reference."""

import pytest
import torch

import losses
from tests.cases import KINDS, make_case
from tests.reference import DTYPES, check_against_reference, targets_for

STRATEGIES = ("loop", "concat", "padded", "kernel", "conditional")


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


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_padded_loss_matches_reference(dtype):
    """torch.compile of the padded loss (Inductor on CPU here, Triton on a GPU)."""
    check_against_reference(losses.get("compiled"), make_case("mixed", B=5, M=16, dtype=dtype))


def test_unknown_strategy_lists_the_known_ones():
    with pytest.raises(Exception, match="loop, concat, padded, compiled, kernel, conditional"):
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
