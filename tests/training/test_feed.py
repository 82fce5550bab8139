"""How a step gets its batch (training/feed.py): copied in the step, or a step ahead on a
side stream. The same batches either way, in the same order; the time waited for the
loader is counted per step; a run copying ahead gets the losses of one copying in place."""

import pytest
import torch

import losses
import train
from data import SyntheticFaces
from data.loader import make_loader
from tests.helpers import SMALL
from training.feed import CopyAhead, InStep


def _loader(ring: bool, pin: bool, workers: int = 0):
    collate = losses.get("padded", capacity=64).collate
    return make_loader(SyntheticFaces(200, 32, seed=11), 8, workers, collate,
                       pin_memory=pin, ring=ring)


def test_in_step_hands_out_each_batch_copied_and_arrived_and_counts_the_wait():
    seen = []

    def copy(batch):
        seen.append("copy")
        return batch

    def arrive(batch):
        seen.append("arrive")
        return batch

    feed = InStep(_loader(ring=False, pin=False), copy, arrive)
    want = list(_loader(ring=False, pin=False))
    for images, (boxes, counts) in want[:3]:
        got_images, (got_boxes, got_counts) = feed.take()
        feed.prepare()  # nothing ahead: the next take() fetches
        assert torch.equal(got_images, images) and torch.equal(got_boxes, boxes)
        assert torch.equal(got_counts, counts)
    assert seen == ["copy", "arrive"] * 3
    assert feed.waited_ms() > 0 and feed.waited_ms() == 0  # read, then reset


def test_in_step_ends_with_the_loader():
    feed = InStep([("a", "b")], lambda b: b, lambda b: b)
    assert feed.take() == ("a", "b")
    with pytest.raises(StopIteration):
        feed.take()


def _device_batches(feed, n):
    out = []
    for _ in range(n):
        images, (boxes, counts) = feed.take()
        feed.prepare()
        out.append((images.clone(), boxes.clone(), counts.clone()))
    return out


@pytest.mark.gpu
def test_batches_copied_ahead_from_the_ring_equal_the_original_loaders_on_the_gpu():
    """Ring slots are rewritten while their copies may be in flight on the side stream:
    every batch that reached the device must be the one the original loader gives."""
    strategy = losses.get("padded", capacity=64)

    def copy(batch):
        images, targets = batch
        return images.to("cuda", non_blocking=True), strategy.to_device(targets, "cuda")

    ahead = CopyAhead(_loader(ring=True, pin=True, workers=2), copy, lambda b: b)
    assert torch.cuda.current_stream() != ahead.stream
    got = _device_batches(ahead, 24)
    want = _device_batches(InStep(_loader(ring=False, pin=True), copy, lambda b: b), 24)
    for (images, boxes, counts), (w_images, w_boxes, w_counts) in zip(got, want, strict=True):
        assert torch.equal(images, w_images) and torch.equal(boxes, w_boxes)
        assert torch.equal(counts, w_counts)


@pytest.mark.gpu
def test_a_run_copying_ahead_gets_the_losses_of_one_copying_in_the_step(tmp_path):
    args = SMALL + ["--out-dir", str(tmp_path), "--steps", "8", "--no-cudnn-benchmark"]
    ahead = train.run(train.parse_config(args))
    in_step = train.run(train.parse_config(args + ["--no-copy-ahead"]))
    assert ahead["batches"]["copy"] == "a step ahead, on a side stream"
    assert in_step["batches"]["copy"] == "in the step"
    assert len(ahead["losses"]) == len(in_step["losses"]) == 8
    # The same batches and weights; the GPU's reductions may add in another order.
    assert ahead["losses"] == pytest.approx(in_step["losses"], rel=1e-3)
    # The side stream's copy is beside the compute stream: the busiest stream's time is
    # then below the step's GPU work in all, by about the copy.
    assert ahead["step"]["busiest_stream_ms"] < ahead["step"]["gpu_ms"]
    assert in_step["step"]["busiest_stream_ms"] == pytest.approx(in_step["step"]["gpu_ms"],
                                                                 rel=0.02)
