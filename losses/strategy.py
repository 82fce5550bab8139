"""What a loss strategy is: how it lays out a batch's targets and how it computes the loss.

A strategy bundles three functions:
- collate(samples) -> (images, targets): `samples` is a list of (image, boxes) pairs;
- to_device(targets, device) -> targets: the host-to-device copies this layout costs;
- loss(pred [B, M, 4], targets) -> scalar tensor.
"""

from dataclasses import dataclass
from typing import Any, Callable

import torch


@dataclass(frozen=True)
class Strategy:
    name: str
    collate: Callable[[list], tuple[torch.Tensor, Any]]
    to_device: Callable[[Any, torch.device], Any]
    loss: Callable[[torch.Tensor, Any], torch.Tensor]
    needs_cuda: bool = False


def list_to_device(targets, device):
    """One host-to-device copy per sample: the cost of keeping targets ragged."""
    return [t.to(device, non_blocking=True) for t in targets]


def tensors_to_device(targets, device):
    """One copy per tensor for the whole batch: padded boxes and counts; packed boxes and
    their index (and the nested layout's offsets)."""
    return tuple(t.to(device, non_blocking=True) for t in targets)
