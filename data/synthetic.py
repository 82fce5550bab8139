"""The workload's synthetic dataset, deterministic per (seed, index): noise images and
|N(0, sigma)| boxes each, so that every strategy and worker count sees the same batches
(the original drew from global NumPy state in its workers). Its design in full: docs/design.md."""

import math
import sys

import numpy as np
import torch
from torch.utils.data import Dataset

from core.errors import UserError

MAX_BOXES_PER_IMAGE = 255  # the workload's clip: a uint8 count


class SyntheticFaces(Dataset):
    def __init__(self, length: int = 1_000_000, image_size: int = 256, seed: int = 0,
                 box_sigma: float = 3.0, max_boxes: int = MAX_BOXES_PER_IMAGE):
        if not 2 <= image_size <= 256:
            # Coordinates are stored as uint8, so the image may be at most 256 pixels wide.
            raise UserError(f"image size {image_size} is out of range: use 2..256 "
                            "(box coordinates are stored as uint8)")
        self.length = length
        self.image_size = image_size
        self.seed = seed
        if not box_sigma >= 0 or max_boxes < 0:
            raise UserError(f"box sigma {box_sigma} and max boxes {max_boxes} must be >= 0")
        self.box_sigma = box_sigma
        self.max_boxes = max_boxes

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int):
        if not 0 <= index < self.length:
            raise IndexError(index)
        rng = np.random.default_rng([self.seed, index])
        s = self.image_size
        image = uniform_bytes(rng, (1, s, s))
        # sigma * |z| is exactly numpy's |normal(0, sigma)|, and stays defined for inf.
        spread = self.box_sigma * abs(rng.standard_normal())
        n = self.max_boxes if spread >= self.max_boxes else int(spread)
        top_left = rng.integers(0, s - 1, size=(n, 2))          # [0, S-2]
        size = rng.integers(1, s, size=(n, 2))                    # [1, S-1]
        bottom_right = np.minimum(top_left + size, s - 1)
        boxes = np.concatenate([top_left, bottom_right], axis=1).astype(np.uint8)
        return torch.from_numpy(image), torch.from_numpy(boxes)


def uniform_bytes(rng: np.random.Generator, shape: tuple[int, ...]) -> np.ndarray:
    """`rng.integers(0, 256, shape, dtype=np.uint8)`, the same bytes, in a third of the time.

    Why: a loader worker spends most of a 256x256 sample's time here (bench/loader_rate.py,
    results/several-gpus.md), and on several GPUs a rank's loaders are its bound. numpy
    draws a full-range uint8 as the bytes of successive 32-bit words, low byte first, and
    PCG64 gives its 32-bit words as the low then the high half of each 64-bit one: so on a
    little-endian host the image is the raw 64-bit stream's bytes, and the generator is
    left exactly where `integers` leaves it when the count is a multiple of 8.
    `_raw_is_integers` checks that once a process against the installed numpy; anything
    else takes the slow path."""
    count = math.prod(shape)
    if count % 8 or not _raw_is_integers() or type(rng.bit_generator) is not np.random.PCG64:
        return rng.integers(0, 256, size=shape, dtype=np.uint8)
    return rng.bit_generator.random_raw(count // 8).view(np.uint8).reshape(shape)


_RAW_CHECKED: list[bool] = []


def _raw_is_integers() -> bool:
    """Whether the raw stream gives integers' bytes and leaves the generator where it
    does, with this numpy on this host (once a process)."""
    if not _RAW_CHECKED:
        slow, fast = np.random.default_rng([1, 2]), np.random.default_rng([1, 2])
        same = (sys.byteorder == "little"
                and np.array_equal(slow.integers(0, 256, size=64, dtype=np.uint8),
                                   fast.bit_generator.random_raw(8).view(np.uint8))
                and slow.integers(0, 2**63) == fast.integers(0, 2**63))
        _RAW_CHECKED.append(bool(same))
    return _RAW_CHECKED[0]
