"""A batch's targets written into a ring slot's bytes by a worker, read back as views by
the main process: what crosses between them is a few numbers per tensor.

Why: pickled (as numpy arrays) the padded targets are 1 MB a batch through the loader's
one result pipe, then pinned in the main thread; the ring loader alone fell from 55-56 to
37-40 batches/s with that at 16 workers on the H100's host (results/host.md). Written into
the slot, they sit in the memory CUDA registered as pinned beside the images: their H2D
copy reads them there, and the main process neither unpickles nor pins them.

    layout = pack(targets, slot_bytes)     # in the worker: None if they do not fit
    targets = unpack(layout, slot_bytes)   # in the main process: views of the slot

A layout mirrors the targets (a tensor, or tuples and lists of them) with (offset, dtype,
shape) for each tensor; offsets are aligned to ALIGN bytes so every dtype's view is legal.
Targets larger than the slot (a batch with far more boxes than the first one) return None
and travel pickled instead (RingLoader does that), never truncated.
"""

import torch

ALIGN = 64


def nbytes(targets) -> int:
    """The bytes pack() needs for these targets, alignment included."""
    if isinstance(targets, torch.Tensor):
        return _aligned(targets.numel() * targets.element_size())
    return sum(nbytes(t) for t in targets)


def pack(targets, slot: torch.Tensor):
    """Copies the targets' tensors into slot (a 1-D uint8 tensor); their layout, or None
    if they do not fit."""
    if nbytes(targets) > slot.numel():
        return None
    return _pack(targets, slot, [0])


def _pack(targets, slot, at):
    if isinstance(targets, torch.Tensor):
        offset, size = at[0], targets.numel() * targets.element_size()
        if size:
            flat = targets.contiguous().view(-1).view(torch.uint8)
            slot[offset:offset + size].copy_(flat)
        at[0] += _aligned(size)
        return (offset, targets.dtype, tuple(targets.shape))
    return type(targets)(_pack(t, slot, at) for t in targets)


def unpack(layout, slot: torch.Tensor):
    """The targets as views of slot, from their layout."""
    if isinstance(layout, tuple) and len(layout) == 3 and isinstance(layout[1], torch.dtype):
        offset, dtype, shape = layout
        size = torch.Size(shape).numel() * dtype.itemsize
        return slot[offset:offset + size].view(dtype).view(shape)
    return type(layout)(unpack(part, slot) for part in layout)


def _aligned(size: int) -> int:
    return -(-size // ALIGN) * ALIGN
