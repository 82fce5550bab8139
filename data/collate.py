"""Collate functions: the strategy decides how the ragged targets are laid out (a list, a
padded tensor with counts, or packed boxes with their index and offsets), all computed
on the host so that the device needs no sync to learn a count. The design in full:
docs/design.md, this module's section."""

import torch

from core.errors import UserError


def check_capacity(samples, capacity: int) -> None:
    """Refuse a sample with more boxes than the model predicts: never truncate silently."""
    counts = [boxes.shape[0] for _, boxes in samples]
    over = [i for i, n in enumerate(counts) if n > capacity]
    if over:
        # The batch's largest, not the first that does not fit: one raise is enough.
        most = max(counts)
        raise UserError(
            f"sample {over[0]} of the batch has {counts[over[0]]} boxes but the model "
            f"predicts only {capacity}: raise --max-boxes to at least {most} (this batch's "
            "largest)")


def _stack_images(samples) -> torch.Tensor:
    if not samples:
        raise UserError("a batch must hold at least one sample: the collate got none")
    return torch.stack([image for image, _ in samples])


def collate_list(samples, capacity: int):
    check_capacity(samples, capacity)
    return _stack_images(samples), [boxes for _, boxes in samples]


def collate_padded(samples, capacity: int):
    check_capacity(samples, capacity)
    counts = torch.tensor([boxes.shape[0] for _, boxes in samples], dtype=torch.int32)
    padded = torch.zeros(len(samples), capacity, 4, dtype=torch.uint8)
    for row, (_, boxes) in enumerate(samples):
        padded[row, :boxes.shape[0]] = boxes
    return _stack_images(samples), (padded, counts)


def packed_targets(per_sample: list[torch.Tensor]):
    """(boxes [N, 4], index int32 [2, N], offsets int64 [B + 1]) of per-sample [n_i, 4]
    boxes: the packed layout, built on the host."""
    counts = torch.tensor([boxes.shape[0] for boxes in per_sample], dtype=torch.int64)
    offsets = torch.zeros(len(per_sample) + 1, dtype=torch.int64)
    torch.cumsum(counts, 0, out=offsets[1:])
    boxes = torch.cat(per_sample) if per_sample else torch.zeros(0, 4, dtype=torch.uint8)
    image = torch.repeat_interleave(torch.arange(len(per_sample)), counts)
    slot = torch.arange(boxes.shape[0]) - offsets[image]
    return boxes, torch.stack([image, slot]).to(torch.int32), offsets


def collate_packed(samples, capacity: int):
    check_capacity(samples, capacity)
    return _stack_images(samples), packed_targets([boxes for _, boxes in samples])
