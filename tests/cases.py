"""Inputs for loss tests: random boxes from a seed each test prints, plus the shapes that break
things (identical, disjoint, nested, touching, degenerate boxes; empty and full samples)."""

import os
import zlib
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from tests.reference import drawn_until, nearest_pool_decision

KINDS = ("random", "identical", "disjoint", "nested", "touching", "degenerate", "mixed")
# Touching boxes whose far edges lie off the integer grid: an intersection exactly 0 that
# a min or max rounded in fp32 moves below 0, where clamp(min=0) then cuts the gradient
# (the nested strategy's old bug). Not in KINDS: test_losses runs it for every
# strategy and dtype beside empty images and a full one.
OFF_GRID = "offgrid"


def _random_boxes(shape, gen, lo=0.0, hi=250.0, min_size=0.5, max_size=120.0):
    x1 = lo + torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo)
    y1 = lo + torch.rand(shape, generator=gen, dtype=torch.float64) * (hi - lo)
    w = min_size + torch.rand(shape, generator=gen, dtype=torch.float64) * (max_size - min_size)
    h = min_size + torch.rand(shape, generator=gen, dtype=torch.float64) * (max_size - min_size)
    return torch.stack([x1, y1, x1 + w, y1 + h], -1)


def _targets_from(boxes):
    return boxes.round().clamp(0, 255)


def _random_targets(shape, gen, lo=0.0, hi=250.0, min_size=1.5, max_size=120.0):
    """Integer targets at least 1 px wide and high, as the dataset makes them. (Zero-area
    targets are the degenerate kind's: beside a touching zero-width prediction their union
    is 0 and the exact gradient is ~1/eps, which fp16 cannot hold.)"""
    return _targets_from(_random_boxes(shape, gen, lo, hi, min_size, max_size))


def make_boxes(kind: str, B: int, M: int, gen: torch.Generator):
    """(pred float64, target float64 integer-valued) of shape [B, M, 4] for one kind."""
    target = _random_targets((B, M), gen)
    if kind == "random":
        pred = _random_boxes((B, M), gen)
    elif kind == "identical":
        pred = target.clone()
    elif kind == "disjoint":
        target = _random_targets((B, M), gen, 0, 60, 1.5, 40)
        pred = _random_boxes((B, M), gen, 130, 200, 1, 40)
    elif kind == "nested":  # pred inside target in half the slots, target inside pred in the rest
        outer = _random_targets((B, M), gen, 0, 60, 100, 150)
        inner = outer + torch.tensor([10.0, 12.0, -14.0, -16.0], dtype=torch.float64)
        flip = torch.rand((B, M, 1), generator=gen) < 0.5
        target = torch.where(flip, outer, inner)
        pred = torch.where(flip, inner + 0.25, outer - 0.25)
    elif kind == "touching":  # pred's left edge on target's right edge, and corners
        pred = target.clone()
        width = target[..., 2] - target[..., 0]
        pred[..., 0] = target[..., 2]
        pred[..., 2] = target[..., 2] + width
        pred[..., 1::2] += torch.randint(-3, 4, (B, M, 1), generator=gen).double()
    elif kind == OFF_GRID:
        pred, target = make_boxes("touching", B, M, gen)
        fraction = torch.rand((B, M, 1), generator=gen, dtype=torch.float64)
        pred[..., 2:] += fraction  # the far corner off the grid; the touching edge stays on it
    elif kind == "degenerate":  # zero width and/or height, points, on both sides
        pred = _random_boxes((B, M), gen).round()
        pred[..., 2] = pred[..., 0]
        target[..., 3] = target[..., 1]
        point = torch.rand((B, M), generator=gen) < 0.3
        pred[point] = torch.tensor([7.0, 9.0, 7.0, 9.0], dtype=torch.float64)
        target[point] = torch.tensor([7.0, 9.0, 7.0, 9.0], dtype=torch.float64)
    elif kind == "mixed":  # every kind at once, slot by slot
        parts = [make_boxes(k, B, M, gen) for k in KINDS[:-1]]
        pick = torch.randint(0, len(parts), (B, M, 1), generator=gen)
        pred = torch.zeros(B, M, 4, dtype=torch.float64)
        target = torch.zeros(B, M, 4, dtype=torch.float64)
        for i, (p, t) in enumerate(parts):
            pred = torch.where(pick == i, p, pred)
            target = torch.where(pick == i, t, target)
    else:
        raise ValueError(kind)
    return pred, target


def make_counts(pattern: str, B: int, M: int, gen: torch.Generator) -> torch.Tensor:
    if pattern == "empty":
        return torch.zeros(B, dtype=torch.int32)
    if pattern == "full":
        return torch.full((B,), M, dtype=torch.int32)
    counts = torch.randint(0, M + 1, (B,), generator=gen, dtype=torch.int32)
    counts[0] = 0
    counts[-1] = M
    return counts


@dataclass
class Case:
    pred: torch.Tensor      # [B, M, 4] in the dtype under test
    boxes: torch.Tensor     # [B, M, 4] padded targets, junk past each count
    counts: torch.Tensor    # [B] int32
    targets: list           # per-sample [n_i, 4] targets
    seed: int               # to replay a failure

    def to(self, device):
        return Case(self.pred.to(device), self.boxes.to(device), self.counts.to(device),
                    [t.to(device) for t in self.targets], self.seed)


_calls: dict[str, int] = {}


def case_seed() -> int:
    """A fixed seed per test and call: the test's id (with its parameters) and how many
    cases it has made, so a failure replays alone or in the whole suite; TEST_SEED=N
    shifts every seed to explore other inputs. Failure messages print the seed."""
    test = os.environ.get("PYTEST_CURRENT_TEST", "").rsplit(" ", 1)[0]
    _calls[test] = _calls.get(test, 0) + 1
    shift = int(os.environ.get("TEST_SEED", "0"))
    return (zlib.crc32(test.encode()) + 7919 * _calls[test] + shift) % 2**31


def make_case(kind, B, M, dtype, counts="mixed", target_dtype=torch.uint8, seed=None):
    """A random case from a fixed seed (case_seed() unless one is given). The padded
    targets hold junk past each count, which every strategy must ignore."""
    seed = case_seed() if seed is None else seed
    gen = torch.Generator()
    gen.manual_seed(seed)
    pred, target = make_boxes(kind, B, M, gen)
    n = make_counts(counts, B, M, gen)
    pred = pred.to(dtype)
    target = target.to(target_dtype)
    target_list = [target[b, :n[b]].clone() for b in range(B)]
    return Case(pred, target, n, target_list, seed)


# The second block decides its pools and ReLUs on fp32 sums, the reference on float64's:
# where the two come within fp32's error of a decision (up to 3e-6 here), they may decide
# otherwise and send a gradient to another pixel, which test_second_block's bounds see.
# Such draws are drawn again, as in tests/kernels/trunk/test_first_block.py.
SECOND_BLOCK_NEAR = 1e-5


def second_block_inputs(B, H, W, device, dtype=torch.float32, channels_last=False,
                        seed=None, decisive=True):
    """x in dtype; the weight and bias fp32 (fp64 for fp64 x) but exactly representable
    in bf16 and fp16, so the kernel's cast of the weight to x's dtype (autocast's) changes
    nothing and the reference sees the same numbers. Drawn from seed (a fresh one if
    None), then, where decisive, again while a pool or ReLU decides within
    SECOND_BLOCK_NEAR. Not at the model's size: there some window always does (100 draws
    in a row, on an H100), and its checks are bounded for them."""
    def draw(gen):
        x = torch.randn(B, 4, H, W, generator=gen).to(dtype)
        weight = (torch.randn(16, 4, 3, 3, generator=gen) * 0.3).bfloat16()
        return x, weight, (torch.randn(16, generator=gen) * 0.1).bfloat16()

    def decides_clearly(x, weight, bias):
        v = F.conv2d(x.double(), weight.double(), bias.double(), padding=1)
        return nearest_pool_decision(v) >= SECOND_BLOCK_NEAR

    x, weight, bias = drawn_until(draw, decides_clearly if decisive else None, seed)
    if channels_last:
        x = x.to(memory_format=torch.channels_last)
    wdt = torch.float64 if dtype == torch.float64 else torch.float32
    return x.to(device), weight.to(wdt).to(device), bias.to(wdt).to(device)
