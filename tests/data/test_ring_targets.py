"""The targets' trip through a ring slot (data/ring_targets.py): every layout comes back
equal, as views of the slot, aligned for its dtype; targets too large for the slot are
refused (the ring loader then sends them pickled, and still gives the original batches)."""

import pytest
import torch
from torch.utils.data import Dataset

import losses
from core.trees import leaves
from data import ring_loader
from data.loader import make_loader
from data.ring_targets import ALIGN, nbytes, pack, unpack


def _equal(a, b) -> bool:
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    return type(a) is type(b) and len(a) == len(b) and all(map(_equal, a, b))


def _random_list(n):
    return [torch.randint(0, 256, (int(k), 4), dtype=torch.uint8)
            for k in torch.randint(0, 6, (n,))] + [torch.zeros(0, 4, dtype=torch.uint8)]


@pytest.mark.parametrize("make", [
    lambda: (torch.randint(0, 256, (5, 7, 4), dtype=torch.uint8),
             torch.randint(0, 7, (5,), dtype=torch.int32)),
    lambda: _random_list(9),
    lambda: torch.randn(3, 5, dtype=torch.float64),
], ids=["padded", "list with empty", "float64"])
def test_targets_come_back_equal_as_aligned_views_of_the_slot(make):
    targets = make()
    slot = torch.full((nbytes(targets) + 3 * ALIGN,), 7, dtype=torch.uint8)
    layout = pack(targets, slot)
    back = unpack(layout, slot)
    assert _equal(back, targets)
    for tensor in leaves(back):
        assert tensor.untyped_storage().data_ptr() == slot.untyped_storage().data_ptr()
        assert (tensor.data_ptr() - slot.data_ptr()) % ALIGN == 0


def test_targets_larger_than_the_slot_are_refused_not_cut():
    targets = _random_list(20)
    assert pack(targets, torch.empty(nbytes(targets) - 1, dtype=torch.uint8)) is None


class _Growing(Dataset):
    """Sample i holds i % 40 boxes: later batches hold far more than the first."""

    def __len__(self):
        return 160

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        return (torch.randint(0, 256, (1, 16, 16), dtype=torch.uint8, generator=g),
                torch.randint(0, 16, (i % 40, 4), dtype=torch.uint8, generator=g))


@pytest.mark.parametrize("workers", (0, 2))
def test_a_batch_too_large_for_its_slot_crosses_pickled_and_equal(monkeypatch, workers):
    monkeypatch.setattr(ring_loader, "TARGET_FLOOR", 0)  # the slot: twice the first batch's
    collate = losses.get("loop", capacity=64).collate
    want = list(make_loader(_Growing(), 4, workers, collate, pin_memory=False))
    ring = make_loader(_Growing(), 4, workers, collate, pin_memory=False, ring=True)
    got = []
    for images, targets in ring:
        got.append((images.clone(), [t.clone() for t in targets]))
    pickled = sum(nbytes(t) > ring.targets.shape[1] for _, t in want)
    assert pickled > 10  # the fallback ran
    assert len(got) == len(want) == 40
    assert all(_equal(g, w) for g, w in zip(got, want))
