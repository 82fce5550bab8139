"""The ring loader gives exactly make_loader's batches (same images, same targets, same
order) for every collate, with and without workers and on a rank's share; a worker's
error reaches the main process as before; a run with it gets the same losses."""

import signal

import pytest
import torch

import losses
import train
from core.errors import UserError
from core.trees import map_leaves
from data import SyntheticFaces
from data.loader import make_loader
from tests.helpers import TINY, gone, signal_after, start_long_run
from training.distributed import RankShare


def _batches(loader, n):
    out = []
    for i, (images, targets) in enumerate(loader):
        if i == n:
            break
        # The ring's batches are views of a slot that is written again later: copy.
        out.append((images.clone(), map_leaves(torch.Tensor.clone, targets)))
    return out


@pytest.mark.parametrize("loss", ("loop", "padded"))
@pytest.mark.parametrize("workers", (0, 2))
def test_the_ring_gives_the_loaders_batches(loss, workers):
    collate = losses.get(loss, capacity=64).collate
    dataset = SyntheticFaces(200, 32, seed=7)
    expected = _batches(make_loader(dataset, 8, workers, collate, pin_memory=False), 9)
    got = _batches(make_loader(dataset, 8, workers, collate, pin_memory=False, ring=True), 9)
    assert len(got) == len(expected) == 9
    for (images, targets), (want_images, want_targets) in zip(got, expected):
        assert torch.equal(images, want_images)
        want = want_targets if loss == "loop" else list(want_targets)
        have = targets if loss == "loop" else list(targets)
        assert len(have) == len(want) and all(torch.equal(a, b) for a, b in zip(have, want))


def test_the_ring_gives_a_ranks_share():
    collate = losses.get("padded", capacity=64).collate
    dataset = SyntheticFaces(120, 32, seed=3)
    share = RankShare(len(dataset), 4, 1, 2)
    expected = _batches(make_loader(dataset, 4, 0, collate, False, sampler=share), 5)
    got = _batches(make_loader(dataset, 4, 0, collate, False, sampler=share, ring=True), 5)
    for (images, (boxes, counts)), (want_images, (want_boxes, want_counts)) in zip(got, expected):
        assert torch.equal(images, want_images) and torch.equal(boxes, want_boxes)
        assert torch.equal(counts, want_counts)


@pytest.mark.parametrize("workers", (0, 1))
def test_a_workers_error_reaches_the_main_process(workers):
    collate = losses.get("padded", capacity=1).collate  # most samples hold more boxes
    loader = make_loader(SyntheticFaces(64, 32, seed=0), 16, workers, collate, False,
                         ring=True)
    with pytest.raises(UserError, match="boxes but the model predicts only 1"):
        next(iter(loader))


def test_ctrl_c_during_a_ring_run_keeps_its_steps_and_leaves_no_worker(tmp_path):
    proc = start_long_run(tmp_path, "--loader", "ring", "--num-workers", "2")
    code, lines = signal_after(proc, "step 5/401 (profiled)", signal.SIGINT)
    assert code == 130 and len(lines) == 1 and "interrupted (Ctrl-C)" in lines[0], lines
    assert [p.name for p in tmp_path.iterdir()] == ["run-interrupted"]
    assert gone(str(tmp_path))


def test_a_run_with_the_ring_gets_the_same_losses(tmp_path):
    args = TINY + ["--out-dir", str(tmp_path), "--num-workers", "2"]
    torch_loader = train.run(train.parse_config(args + ["--loader", "torch"]))["losses"]
    ring = train.run(train.parse_config(args))  # the default
    assert ring["losses"] == torch_loader and ring["config"]["loader"] == "ring"


@pytest.mark.gpu
def test_the_rings_pinned_batches_reach_the_gpu_intact():
    collate = losses.get("padded", capacity=64).collate
    dataset = SyntheticFaces(400, 64, seed=5)
    expected = _batches(make_loader(dataset, 16, 2, collate, pin_memory=True), 12)
    loader = make_loader(dataset, 16, 2, collate, pin_memory=True, ring=True)
    got = []
    for i, (images, (boxes, _)) in enumerate(loader):
        if i == 12:
            break
        assert loader.pinned and images.is_pinned() and boxes.is_pinned()
        got.append(images.to("cuda", non_blocking=True))  # read a slot: the ring's copy
    for device_images, (want, _) in zip(got, expected, strict=True):
        assert torch.equal(device_images.cpu(), want)  # host-device sync: the check
    loader.close()
    assert not loader.pinned
