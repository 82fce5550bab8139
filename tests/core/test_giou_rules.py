"""One contract for bad values, the same in every strategy (core/giou_rules.py):
- a count outside [0, M] (padded layouts; the ragged ones cannot express one) makes the
  loss NaN and every gradient of that sample NaN, and leaves the other samples' finite;
- a packed box whose image or slot is out of range makes the loss NaN and every box's
  gradient NaN; rows no box names stay exactly 0;
- NaN or inf in a slot past its count changes nothing: same loss, same gradients, and
  exactly 0 as that slot's gradient;
- bool or complex targets are refused with the same error by every strategy."""

import pytest
import torch

import losses
from core.errors import InputError
from core.names import FUSED, PACKED, RAGGED, STRATEGIES
from tests.cases import make_case
from tests.helpers import compiler_marks
from tests.reference import targets_for

gpu = pytest.mark.gpu
# (strategy, backend, device): every strategy on the CPU; on a GPU every strategy and the
# fused ones with both backends.
RUNS = ([pytest.param(s, "triton", "cpu", id=f"{s}-cpu", marks=compiler_marks(s))
         for s in STRATEGIES]
        + [pytest.param(s, "triton", "cuda", id=f"{s}-cuda", marks=gpu) for s in STRATEGIES]
        + [pytest.param(s, "cuda", "cuda", id=f"{s}-cuda-cuda", marks=gpu)
           for s in FUSED])
PADDED_RUNS = [r for r in RUNS if r.values[0] not in RAGGED + PACKED]
PACKED_RUNS = [r for r in RUNS if r.values[0] in PACKED]


def _loss_and_grad(name, backend, case, pred):
    pred = pred.clone().requires_grad_(True)
    loss = losses.get(name, backend=backend).loss(pred, targets_for(name, case))
    loss.backward()
    return loss.detach(), pred.grad


@pytest.mark.parametrize("name,backend,device", RUNS)
@pytest.mark.parametrize("bad", (float("nan"), float("inf"), -float("inf")), ids=str)
@pytest.mark.parametrize("dtype", (torch.float32, torch.bfloat16), ids=str)
def test_non_finite_padding_changes_nothing(name, backend, device, bad, dtype):
    case = make_case("random", 4, 12, dtype).to(device)
    slots = torch.arange(12, device=device)
    padding = slots[None, :] >= case.counts[:, None]          # [B, M]
    dirty = torch.where(padding[..., None], torch.tensor(bad, dtype=dtype, device=device),
                        case.pred)
    clean_loss, clean_grad = _loss_and_grad(name, backend, case, case.pred)
    loss, grad = _loss_and_grad(name, backend, case, dirty)
    where = f"{name} seed={case.seed}"
    assert torch.equal(loss, clean_loss), where
    assert torch.equal(grad, clean_grad), where
    assert (grad[padding] == 0).all(), where


@pytest.mark.parametrize("name,backend,device", PADDED_RUNS)
@pytest.mark.parametrize("count", (-1, 13))
def test_a_count_outside_the_slots_poisons_its_sample(name, backend, device, count):
    case = make_case("random", 3, 12, torch.float32)
    case.counts[1] = count
    case = case.to(device)
    loss, grad = _loss_and_grad(name, backend, case, case.pred)
    where = f"{name} seed={case.seed}"
    assert torch.isnan(loss), where
    assert torch.isnan(grad[1]).all(), where
    assert torch.isfinite(grad[0]).all() and torch.isfinite(grad[2]).all(), where


@pytest.mark.parametrize("name,backend,device", PACKED_RUNS)
@pytest.mark.parametrize("row,value", ((0, -1), (0, 3), (1, -1), (1, 12)),
                         ids=("image-1", "image=B", "slot-1", "slot=M"))
def test_a_packed_place_outside_the_predictions_poisons_every_box(name, backend, device,
                                                                  row, value):
    case = make_case("random", 3, 12, torch.float32).to(device)
    targets = list(targets_for(name, case))
    index = targets[1].clone()
    index[row, index.shape[1] // 2] = value
    targets[1] = index
    pred = case.pred.clone().requires_grad_(True)
    loss = losses.get(name, backend=backend).loss(pred, tuple(targets))
    loss.backward()
    where = f"{name} seed={case.seed}"
    assert torch.isnan(loss), where
    slots = torch.arange(12, device=device)
    padding = slots[None, :] >= case.counts[:, None]
    named = torch.zeros(3, 12, dtype=torch.bool, device=device)
    ok = (index[0] >= 0) & (index[0] < 3) & (index[1] >= 0) & (index[1] < 12)
    named[index[0][ok].long(), index[1][ok].long()] = True
    assert torch.isnan(pred.grad[named]).all(), where
    assert (pred.grad[padding] == 0).all(), where


@pytest.mark.parametrize("name", STRATEGIES)
def test_bool_targets_are_refused_by_every_strategy(name):
    case = make_case("random", 2, 8, torch.float32)
    case.boxes = case.boxes.bool()
    case.targets = [t.bool() for t in case.targets]
    with pytest.raises(InputError, match="must be an integer or float tensor, got torch.bool"):
        losses.get(name).loss(case.pred, targets_for(name, case))
