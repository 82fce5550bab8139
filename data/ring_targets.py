"""A batch's targets written into a ring slot's bytes by a worker and read back as views
by the main process, rather than pickled and pinned (a third of the ring loader's rate);
targets too large for the slot travel pickled. Its design in full: docs/design.md."""

from dataclasses import dataclass

import torch

from core.trees import leaves, map_leaves

ALIGN = 64


@dataclass(frozen=True)
class Placed:
    """Where one target tensor lies in its slot."""
    offset: int
    dtype: torch.dtype
    shape: tuple[int, ...]


def nbytes(targets) -> int:
    """The bytes pack() needs for these targets, alignment included."""
    return sum(_aligned(t.numel() * t.element_size()) for t in leaves(targets))


def pack(targets, slot: torch.Tensor):
    """Copies the targets' tensors into slot (a 1-D uint8 tensor); their layout, or None
    if they do not fit."""
    if nbytes(targets) > slot.numel():
        return None
    at = 0  # the next free byte

    def place(tensor: torch.Tensor) -> Placed:
        nonlocal at
        offset, size = at, tensor.numel() * tensor.element_size()
        if size:
            slot[offset:offset + size].copy_(tensor.contiguous().view(-1).view(torch.uint8))
        at += _aligned(size)
        return Placed(offset, tensor.dtype, tuple(tensor.shape))
    return map_leaves(place, targets)


def unpack(layout, slot: torch.Tensor):
    """The targets as views of slot, from their layout."""
    def view(placed: Placed) -> torch.Tensor:
        size = torch.Size(placed.shape).numel() * placed.dtype.itemsize
        return slot[placed.offset:placed.offset + size].view(placed.dtype).view(placed.shape)
    return map_leaves(view, layout)


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN
