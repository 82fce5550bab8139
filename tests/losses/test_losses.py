"""Every strategy's loss and gradient against the independent float64 reference."""

import pytest
import torch

import losses
from core.names import COMPILED, PACKED, RAGGED
from core.names import STRATEGIES as ALL_STRATEGIES
from tests.cases import KINDS, OFF_GRID, make_case
from tests.helpers import ONE_CPU_COMPILER, compiler_marks
from tests.reference import DTYPES, check_against_reference, targets_for

# compiled and compiled_packed have their own tests (a compile per dtype is slow on CPU;
# tests/losses/test_packed.py runs compiled_packed over the dtypes and shapes).
STRATEGIES = tuple(s for s in ALL_STRATEGIES if s not in COMPILED)


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


@pytest.mark.parametrize("name", [pytest.param(s, marks=compiler_marks(s))
                                  for s in ALL_STRATEGIES])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_images_beside_a_full_one_with_edges_off_the_grid(name, dtype):
    """The case: images with no box, one with every one of 256 slots filled, fp32
    predictions touching their targets with the far corner off the integer grid. nested
    once lost 1e-2 to 1e-1 of its gradient here: its min and max, written as
    (a + b -/+ |a - b|) / 2, rounded a touching intersection of 0 below 0, and clamp cut
    the gradient every other strategy passes. Every strategy, so no layout misses it."""
    case = make_case(OFF_GRID, B=4, M=256, dtype=dtype)
    case.counts = torch.tensor([0, 256, 0, 5], dtype=torch.int32)
    case.targets = [case.boxes[b, :n].clone() for b, n in enumerate(case.counts.tolist())]
    check_against_reference(losses.get(name, capacity=256), case)


@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("B,M", [(0, 8), (3, 0)])
def test_no_sample_or_no_slot_is_a_zero_loss(name, B, M):
    """An empty batch, or a model with no box slot: loss 0 and a zero gradient for every
    strategy (the ragged ones raised torch.cat's and an IndexError here)."""
    pred = torch.rand(B, M, 4, requires_grad=True)
    if name in RAGGED:
        targets = [torch.zeros(0, 4, dtype=torch.uint8) for _ in range(B)]
    elif name in PACKED:
        from data.collate import packed_targets
        targets = packed_targets([torch.zeros(0, 4, dtype=torch.uint8)] * B)
    else:
        targets = (torch.zeros(B, M, 4, dtype=torch.uint8), torch.zeros(B, dtype=torch.int32))
    loss = losses.get(name, capacity=max(M, 1)).loss(pred, targets)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(pred.grad, torch.zeros_like(pred))


def test_a_collate_of_no_sample_is_one_clear_error():
    from core.errors import UserError
    for name in ("loop", "padded", "packed", "nested"):
        with pytest.raises(UserError, match="at least one sample"):
            losses.get(name).collate([])


def test_giou_is_one_minus_giou_with_clamped_intersection():
    """Known values: identical boxes lose 0; disjoint boxes get no intersection."""
    from losses.giou import giou_loss_terms
    same = torch.tensor([[10.0, 10.0, 20.0, 20.0]])
    assert giou_loss_terms(same, same).item() == pytest.approx(0.0, abs=1e-6)
    a = torch.tensor([[0.0, 0.0, 10.0, 10.0]])
    b = torch.tensor([[20.0, 20.0, 30.0, 30.0]])  # both extents negative: I must be 0
    hull, union = 900.0, 200.0
    assert giou_loss_terms(a, b).item() == pytest.approx(1 + (hull - union) / hull, rel=1e-6)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_paired_giou_is_bitwise_the_coordinate_form(kind, dtype):
    """giou_loss_terms (one maximum and minimum of the 4-vectors, extents in pairs) gives
    the per-coordinate form's terms bit for bit, and its gradient bit for bit wherever a
    box has no coordinate equal to its target's: the same arithmetic per element, fewer
    launches. Where one ties, max and min split the gradient in both forms, but autograd
    sums a coordinate's paths in another order, and at identical boxes those paths cancel
    to rounding noise; there the float64 reference checks it (the strategies' tests)."""
    from core.giou_rules import compute_dtype
    from losses.giou import giou_loss_terms, giou_terms_of
    case = make_case(kind, B=4, M=32, dtype=dtype)

    def terms_and_grad(form):
        pred = case.pred.clone().requires_grad_()
        terms = form(pred, case.boxes)
        weights = torch.arange(terms.numel(), dtype=terms.dtype).view_as(terms) % 7
        (grad,) = torch.autograd.grad((terms * weights).sum(), pred)
        return terms.detach(), grad

    def by_coordinate(pred, target):
        dt = compute_dtype(pred)
        return giou_terms_of(*pred.to(dt).unbind(-1), *target.to(dt).unbind(-1))

    (t0, g0), (t1, g1) = terms_and_grad(by_coordinate), terms_and_grad(giou_loss_terms)
    assert torch.equal(t0, t1)
    untied = (case.pred.to(compute_dtype(case.pred)) != case.boxes).all(-1)
    assert kind == "identical" or untied.sum() >= untied.numel() // 4, "too few untied boxes"
    assert torch.equal(g0[untied], g1[untied])


@ONE_CPU_COMPILER
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_compiled_padded_loss_matches_reference(dtype):
    """torch.compile of the padded loss (Inductor on CPU here, Triton on a GPU)."""
    check_against_reference(losses.get("compiled"), make_case("mixed", B=5, M=16, dtype=dtype))


def test_unknown_strategy_or_backend_lists_the_known_ones():
    with pytest.raises(ValueError, match="unknown loss strategy 'nope': choose one of loop, "
                       "concat, padded, compiled, kernel, conditional, packed, nested"):
        losses.get("nope")
    # A backend typo is an error for every strategy, not only the fused ones.
    with pytest.raises(ValueError, match="unknown kernel backend 'bogus': choose one of "
                       "triton, cuda"):
        losses.get("padded", backend="bogus")


@pytest.mark.parametrize("name", ALL_STRATEGIES)
def test_bad_shapes_are_clear_errors(name):
    from core.errors import InputError
    case = make_case("random", B=2, M=8, dtype=torch.float32)
    strategy = losses.get(name)
    with pytest.raises(InputError, match="predictions must be a \\[batch, slots, 4\\] tensor"):
        strategy.loss(case.pred[..., :3], targets_for(name, case))
    one_sample = ("offsets must be a \\[2\\] tensor \\(batch \\+ 1\\), got \\(3,\\)"
                  if name in PACKED else
                  "predictions hold 1 samples but the targets hold 2" if name in RAGGED else
                  "padded targets \\(2, 8, 4\\) must have the predictions' shape \\(1, 8, 4\\)")
    with pytest.raises(InputError, match=one_sample):
        strategy.loss(case.pred[:1], targets_for(name, case))
