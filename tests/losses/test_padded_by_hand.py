"""padded's loss with its backward written by hand (losses/padded_by_hand.py): the forward
bit for bit padded's, the gradient autograd's to rounding and the float64 reference's to
the strategies' tolerances, the bad-value contract kept, and the switch that applies it."""

import dataclasses

import pytest
import torch

import losses
import train
from losses.padded import padded_loss
from losses.padded_by_hand import padded_loss_by_hand
from tests.cases import KINDS, OFF_GRID, make_case
from tests.helpers import cli, one_line_and_nothing_written
from tests.reference import DTYPES, check_against_reference, grad_floor, rel_err
from training import speedups

BY_HAND = dataclasses.replace(losses.get("padded", capacity=256), loss=padded_loss_by_hand)
# fp32 and fp64: the same maths rounded in another order; bf16 and fp16 gradients are
# rounded to 8 and 11 bits after it, so one rounding may land on the other side.
AGAINST_AUTOGRAD = {torch.float32: 1e-6, torch.float64: 1e-14, torch.bfloat16: 8e-3,
                    torch.float16: 1e-3}


def _loss_and_grad(fn, case, pred, upstream=1.0):
    pred = pred.clone().requires_grad_(True)
    loss = fn(pred, (case.boxes, case.counts))
    (loss * upstream).backward()
    return loss.detach(), pred.grad


@pytest.mark.parametrize("device", ("cpu", pytest.param("cuda", marks=pytest.mark.gpu)))
@pytest.mark.parametrize("dtype", (*DTYPES, torch.float64), ids=str)
@pytest.mark.parametrize("kind", (*KINDS, OFF_GRID))
def test_the_loss_is_paddeds_bit_for_bit_and_the_gradient_autograds(kind, dtype, device):
    case = make_case(kind, B=6, M=32, dtype=dtype).to(device)
    upstream = float(torch.empty(()).uniform_(0.5, 2.0))
    loss, grad = _loss_and_grad(padded_loss, case, case.pred, upstream)
    hand_loss, hand_grad = _loss_and_grad(padded_loss_by_hand, case, case.pred, upstream)
    where = f"{kind} seed={case.seed}"
    assert torch.equal(hand_loss, loss), where
    assert hand_grad.dtype == grad.dtype, where
    floor = grad_floor(upstream, case.counts)
    assert rel_err(hand_grad, grad, floor) < AGAINST_AUTOGRAD[dtype], where


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("kind", (*KINDS, OFF_GRID))
def test_the_loss_matches_the_float64_reference(kind, dtype):
    check_against_reference(BY_HAND, make_case(kind, B=5, M=16, dtype=dtype))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_images_beside_a_full_one_of_256_boxes(dtype):
    case = make_case(OFF_GRID, B=4, M=256, dtype=dtype)
    case.counts = torch.tensor([0, 256, 0, 5], dtype=torch.int32)
    check_against_reference(BY_HAND, case)
    empty = make_case("mixed", B=3, M=256, dtype=dtype, counts="empty")
    loss, grad = _loss_and_grad(padded_loss_by_hand, empty, empty.pred)
    assert loss.item() == 0.0 and torch.equal(grad, torch.zeros_like(grad))


@pytest.mark.parametrize("B,M", [(0, 8), (3, 0)])
def test_no_sample_or_no_slot_is_a_zero_loss(B, M):
    pred = torch.rand(B, M, 4, requires_grad=True)
    targets = (torch.zeros(B, M, 4, dtype=torch.uint8), torch.zeros(B, dtype=torch.int32))
    loss = padded_loss_by_hand(pred, targets)
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(pred.grad, torch.zeros_like(pred))


@pytest.mark.parametrize("bad", (float("nan"), float("inf"), -float("inf")), ids=str)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_non_finite_padding_changes_nothing(bad, dtype):
    """core/giou_rules.py: NaN or inf in a slot past its count (in the predictions or the
    padded targets) leaves the loss and every gradient as they were, its own exactly 0."""
    case = make_case("random", 4, 12, dtype)
    padding = torch.arange(12)[None, :] >= case.counts[:, None]
    clean_loss, clean_grad = _loss_and_grad(padded_loss_by_hand, case, case.pred)
    case.boxes = torch.where(padding[..., None], bad, case.boxes)
    dirty = torch.where(padding[..., None], torch.tensor(bad, dtype=dtype), case.pred)
    loss, grad = _loss_and_grad(padded_loss_by_hand, case, dirty)
    assert torch.equal(loss, clean_loss) and torch.equal(grad, clean_grad), case.seed
    assert (grad[padding] == 0).all() and not torch.signbit(grad[padding]).any(), case.seed


@pytest.mark.parametrize("count", (-1, 13))
def test_a_count_outside_the_slots_poisons_its_sample_alone(count):
    case = make_case("random", 3, 12, torch.float32)
    case.counts[1] = count
    loss, grad = _loss_and_grad(padded_loss_by_hand, case, case.pred)
    assert torch.isnan(loss) and torch.isnan(grad[1]).all(), case.seed
    assert torch.isfinite(grad[0]).all() and torch.isfinite(grad[2]).all(), case.seed


def test_a_tie_of_prediction_and_target_splits_the_gradient_as_autograd_does():
    """Identical corners: every max and min ties, so each side gets half; a nested box
    ties nothing. Both against autograd, whose convention the kernels document."""
    target = torch.tensor([[[10.0, 20.0, 50.0, 70.0], [10.0, 20.0, 50.0, 70.0]]])
    pred = torch.tensor([[[10.0, 20.0, 40.0, 90.0], [12.0, 25.0, 45.0, 60.0]]])
    counts = torch.tensor([2])
    grads = []
    for fn in (padded_loss, padded_loss_by_hand):
        p = pred.clone().requires_grad_(True)
        fn(p, (target, counts)).backward()
        grads.append(p.grad)
    assert rel_err(grads[1], grads[0]) < 1e-6 and grads[0].abs().min() > 0


def _used(*args):
    return speedups.resolve(train.parse_config(["--preset", "cpu", *args]), cuda=False)


def test_it_is_on_for_padded_in_train_mode_and_off_where_nothing_is_autograds():
    used = _used("--loss", "padded")
    assert used["on"]["padded_backward_by_hand"]
    assert speedups.wrap_loss(used["on"], padded_loss) is padded_loss_by_hand
    for loss in ("loop", "concat", "compiled", "kernel", "conditional", "packed", "nested"):
        used = _used("--loss", loss)
        assert not used["on"]["padded_backward_by_hand"], loss
        assert f"the {loss} strategy's is not" in \
            used["padded_backward_by_hand_off_because"], loss
    assert _used("--mode", "forward")["padded_backward_by_hand_off_because"] == \
        "forward mode runs no backward"
    assert _used("--padded-backward-by-hand", "off")["padded_backward_by_hand_off_because"] \
        == "turned off"
    assert not _used("--baseline")["on"]["padded_backward_by_hand"]


def test_asked_for_another_strategy_it_is_one_line(tmp_path):
    one_line_and_nothing_written(
        cli("--out-dir", str(tmp_path), "--loss", "kernel", "--padded-backward-by-hand", "on"),
        tmp_path, "--padded-backward-by-hand on: only padded's backward is autograd's")
