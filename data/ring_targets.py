"""A batch's targets written into a ring slot's bytes by a worker, read back as views by
the main process: what crosses between them is a few numbers per tensor.

Why: pickled (as numpy arrays) the padded targets are 1 MB a batch through the loader's
one result pipe, then pinned in the main thread, which cost the ring loader a third of its
rate (results/host.md). Written into
the slot, they sit in the memory CUDA registered as pinned beside the images: their H2D
copy reads them there, and the main process neither unpickles nor pins them.

    layout = pack(targets, slot_bytes)     # in the worker: None if they do not fit
    targets = unpack(layout, slot_bytes)   # in the main process: views of the slot

A layout mirrors the targets (a tensor, or tuples and lists of them: core/trees.py) with a
Placed(offset, dtype, shape) for each tensor; offsets are aligned to ALIGN bytes so every
dtype's view is legal.
Targets larger than the slot (a batch with far more boxes than the first one) return None
and travel pickled instead (RingLoader does that), never truncated.
"""

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
