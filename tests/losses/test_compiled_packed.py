"""compiled_packed (losses/compiled_packed.py): Inductor over the packed layout with
dynamic shapes, fed 50 batches whose box count N differs, as an epoch feeds it: how many
graphs the compiler makes (profiling/compile_account.py, Dynamo's own count), and every
batch's loss and gradient against the float64 reference."""

import random

import pytest
import torch

import losses
from data import SyntheticFaces
from data.collate import collate_padded
from profiling import compile_account
from tests.helpers import ONE_CPU_COMPILER
from tests.reference import GRAD_TOL, reference_loss, rel_err

BATCHES, BATCH, CAPACITY = 50, 6, 64


def _batches_of_two_boxes_or_more(dataset, strategy, batch: int) -> list:
    """BATCHES (samples, packed targets) of `batch` samples, in the dataset's order,
    skipping any with fewer than 2 boxes in all: Dynamo specialises N of 0 and 1 (a graph
    of their own), and six small images now and then hold one box between them."""
    kept = []
    for start in range(0, len(dataset) - batch + 1, batch):
        samples = [dataset[start + i] for i in range(batch)]
        _, targets = strategy.collate(samples)
        if targets[0].shape[0] >= 2:
            kept.append((samples, targets))
        if len(kept) == BATCHES:
            return kept
    raise AssertionError(f"fewer than {BATCHES} batches of 2 boxes or more")


@ONE_CPU_COMPILER
def test_fifty_batches_of_different_n_compile_once():
    torch._dynamo.reset()
    strategy = losses.get("compiled_packed", capacity=CAPACITY)
    dataset = SyntheticFaces(4 * BATCHES * BATCH, 32, seed=random.randrange(1 << 20),
                             box_sigma=4.0)
    since, counts = compile_account.begin(), []
    batches = _batches_of_two_boxes_or_more(dataset, strategy, BATCH)
    for b, (samples, targets) in enumerate(batches):
        _, (boxes, n_per_image) = collate_padded(samples, CAPACITY)
        # Sorted, (x1, y1, x2, y2) is a valid box: x1 <= x2 and y1 <= y2.
        pred = (torch.rand(BATCH, CAPACITY, 4) * 31).sort(-1).values.bfloat16()
        pred.requires_grad_(True)
        loss = strategy.loss(pred, targets)
        loss.backward()
        ref_loss, ref_grad = reference_loss(pred, boxes, n_per_image)
        assert rel_err(loss, ref_loss, 1.0) < 1e-5, b
        assert rel_err(pred.grad, ref_grad) < GRAD_TOL[torch.bfloat16], b
        counts.append(targets[0].shape[0])
    acc = compile_account.account(since, None)
    assert len(set(counts)) > 10, counts  # N really changed
    # One graph for every N of 2 and more; Dynamo specialises 0 and 1, which no batch
    # here has (chosen so, and asserted, so that the count means what it says).
    assert min(counts) >= 2, counts
    assert acc["frames_compiled"] <= 2 and acc["graph_breaks"] == 0, acc
    print(f"{BATCHES} batches, N from {min(counts)} to {max(counts)}: "
          f"{acc['frames_compiled']} compiles, {acc['recompiles']} recompiles "
          f"({list(acc['recompile_reasons'])}), {acc['compile_s']:.1f} s")


@pytest.mark.gpu
def test_fifty_batches_on_the_gpu_compile_once():
    """The same on this torch's Inductor and Triton (2.11 on the GPU machine), bf16
    predictions at the model's 256 slots."""
    torch._dynamo.reset()
    strategy = losses.get("compiled_packed", capacity=256)
    dataset = SyntheticFaces(BATCHES * 32, 256, seed=random.randrange(1 << 20))
    since, counts = compile_account.begin(), []
    for b in range(BATCHES):
        samples = [dataset[b * 32 + i] for i in range(32)]
        _, targets = strategy.collate(samples)
        targets = strategy.to_device(targets, torch.device("cuda"))
        pred = (torch.rand(32, 256, 4, device="cuda") * 255).sort(-1).values.bfloat16()
        pred.requires_grad_(True)
        strategy.loss(pred, targets).backward()
        counts.append(targets[0].shape[0])
    acc = compile_account.account(since, None)
    assert len(set(counts)) > 10 and min(counts) >= 2, counts
    assert acc["frames_compiled"] <= 2 and acc["graph_breaks"] == 0, acc
