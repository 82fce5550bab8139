"""profiling/flops.py: the model's FLOPs a step as FlopCounterMode counts them, held
against the shapes' own formulas at fresh random sizes; the loss and the optimizer count
nothing; the peaks by device name; MFU and its '-'."""

import random

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

import losses
from data import SyntheticFaces
from model.boxnet import BoxNet
from profiling import flops


def _by_formula(batch: int, size: int, capacity: int, hidden: int) -> int:
    """2 FLOPs a multiply-add. Each conv and linear layer: a forward, a weight gradient
    and an input gradient of the same count, except the first conv's input gradient
    (the pixels need none)."""
    total = 0
    for i in range(4):
        c_in, c_out, side = 4 ** i, 4 ** (i + 1), size >> i
        one = 2 * batch * c_out * c_in * 9 * side * side
        total += one * (2 if i == 0 else 3)
    features = 256 * (size // 16) ** 2
    total += 3 * 2 * batch * features * hidden
    total += 3 * 2 * batch * hidden * capacity * 4
    return total


def test_the_count_is_the_shapes_formula_at_random_sizes():
    rng = random.Random()
    for _ in range(3):
        shape = (rng.randint(1, 9), 16 * rng.randint(1, 6), rng.randint(1, 40),
                 rng.randint(1, 300))
        assert flops.step_flops(*shape) == _by_formula(*shape), shape


def test_the_gpu_preset_step_is_7_93_tflop():
    """The figure the module's docstring quotes (and bench/roofline.py counted by hand)."""
    assert flops.step_flops(1024, 256, 256, 16384) == _by_formula(1024, 256, 256, 16384)
    assert round(flops.step_flops(1024, 256, 256, 16384) / 1e12, 2) == 7.93


def _forward_by_formula(batch, size, capacity, hidden):
    """The forward alone: each conv, lin1 and lin2 once."""
    convs = sum(2 * batch * 4 ** (i + 1) * 4 ** i * 9 * (size >> i) ** 2 for i in range(4))
    features = 256 * (size // 16) ** 2
    return convs + 2 * batch * features * hidden + 2 * batch * hidden * capacity * 4


def test_forward_mode_counts_the_forward_alone():
    """make profile MODE=forward printed MFU 142 % on an H100: it counted the backward's
    FLOPs over a forward's time."""
    rng = random.Random()
    shape = (rng.randint(1, 9), 16 * rng.randint(1, 6), rng.randint(1, 40), rng.randint(1, 300))
    assert flops.step_flops(*shape, mode="forward") == _forward_by_formula(*shape), shape
    assert round(flops.step_flops(1024, 256, 256, 16384, mode="forward") / 1e12, 2) == 2.64
    line = flops.describe(flops.utilisation(2.64e12, None, None), "x", "cpu", "forward")
    assert line.startswith("model: 2.64 TFLOP a step (the forward alone, FlopCounterMode)")


@pytest.mark.parametrize("name", ["padded", "concat"])
def test_the_loss_and_the_optimizer_count_no_flops(name):
    """Why the count may stand in a sum for the loss: FlopCounterMode counts matmuls and
    convolutions, and the GIoU and SGD are elementwise."""
    torch.manual_seed(random.randrange(1 << 30))
    model = BoxNet(32, 16, 24)
    strategy = losses.get(name, "triton", capacity=16)
    images, targets = strategy.collate([SyntheticFaces(8, 32, 0)[i] for i in range(4)])
    boxes = model(images)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    with FlopCounterMode(display=False) as counter:
        loss = strategy.loss(boxes, targets)
    assert counter.get_total_flops() == 0
    loss.backward()
    with FlopCounterMode(display=False) as counter:
        optimizer.step()
    assert counter.get_total_flops() == 0


@pytest.mark.parametrize("name,peak", [
    ("NVIDIA H100 80GB HBM3", 989e12), ("NVIDIA H100 PCIe", 756e12),
    ("NVIDIA H100 NVL", 835e12), ("NVIDIA H200", 989e12), ("NVIDIA A100-SXM4-80GB", 312e12),
])
def test_the_peak_is_the_devices(name, peak):
    assert flops.peak_of(name).bf16_flops == peak


@pytest.mark.parametrize("name", ["x86_64", "cpu", "NVIDIA GeForce RTX 4090", "", None])
def test_an_unknown_device_has_no_peak_and_no_mfu(name):
    assert flops.peak_of(name) is None
    account = flops.utilisation(7.93e12, 0.0217, name)
    assert account["mfu"] is None and account["peak_tflop_per_s"] is None
    line = flops.describe(account, "the step's device time", name or "cpu")
    assert line.endswith("MFU -: no dense bf16 peak known for "
                         f"{name or 'cpu'} (profiling/flops.py)"), line


def test_mfu_is_the_rate_over_the_peak():
    account = flops.utilisation(7.927e12, 0.0217, "NVIDIA H100 80GB HBM3")
    assert account["tflop_per_s"] == pytest.approx(365.3, abs=0.05)
    assert account["mfu"] == pytest.approx(7.927e12 / 0.0217 / 989e12)
    line = flops.describe(account, "the step's device time", "NVIDIA H100 80GB HBM3")
    assert line == ("model: 7.93 TFLOP a step (forward and backward, FlopCounterMode); "
                    "over the step's device time 365 TFLOP/s, MFU 36.9 % of the dense bf16 "
                    "peak (989 TFLOP/s)")


def test_without_gpu_time_the_mfu_is_a_dash():
    account = flops.utilisation(1e9, None, None)
    assert account["tflop_per_s"] is None and account["mfu"] is None
    assert flops.describe(account, "x", "cpu").endswith("MFU -: no GPU time")


def test_the_sustained_mfu_closes_the_line():
    account = {**flops.utilisation(7.927e12, 0.0217, "NVIDIA H200"), "sustained_mfu": 0.35}
    assert flops.describe(account, "x", "NVIDIA H200").endswith(
        "(989 TFLOP/s); at the sustained rate 35.0 %")


def test_the_columns_of_a_run_and_of_an_old_summary():
    account = flops.utilisation(7.927e12, 0.0217, "NVIDIA H100 80GB HBM3")
    assert flops.cells(account) == {"model TFLOP/step": 7.927,
                                    "TFLOP/s": pytest.approx(365.29, abs=0.01),
                                    "MFU %": pytest.approx(36.94, abs=0.01)}
    assert flops.cells(None) == dict.fromkeys(flops.COLUMNS)
