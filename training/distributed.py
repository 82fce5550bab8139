"""Several ranks, one global batch: N ranks of batch b train exactly as one process of
batch N*b. Each rank takes its slice of every global batch, scales its loss by the global
box count (all-reduced in the background) and by what the gradient reduction does.
Its design in full: docs/design.md."""

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from core.names import PACKED, RAGGED


class RankShare(Sampler):
    """Rank `rank`'s indices of each global batch of world * batch samples, in order; the
    last incomplete global batch is dropped, as the one-process loader drops it."""

    def __init__(self, length: int, batch: int, rank: int, world: int):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside a world of {world}")
        self.length, self.batch, self.rank, self.world = length, batch, rank, world

    @classmethod
    def of(cls, spread, ranks) -> "RankShare | None":
        """A run's share on several ranks; None (the loader's own order) on one."""
        if not ranks.distributed:
            return None
        return cls(spread.dataset_length, spread.batch_size, ranks.rank, ranks.world)

    def __len__(self) -> int:
        return self.length // (self.batch * self.world) * self.batch

    def __iter__(self):
        step = self.batch * self.world
        for start in range(0, self.length - step + 1, step):
            first = start + self.rank * self.batch
            yield from range(first, first + self.batch)


def local_boxes(loss_name: str, targets, device) -> torch.Tensor:
    """This rank's valid boxes as a 0-d tensor on the device, without a host sync: the
    padded layouts' counts summed there; the ragged lists' lengths and the packed boxes'
    N are host metadata, filled into a device scalar (a fill kernel, no copy)."""
    if loss_name in RAGGED:
        boxes = sum(int(t.shape[0]) for t in targets)
    elif loss_name in PACKED:
        boxes = int(targets[0].shape[0])  # the packed [N, 4] boxes
    else:
        return targets[1].sum(dtype=torch.int64)
    return torch.full((), boxes, dtype=torch.int64, device=device)


def _local_sum(loss: torch.Tensor, boxes: torch.Tensor) -> torch.Tensor:
    return loss * boxes.clamp(min=1).to(loss.dtype)


def _backpropagated(local_sum, total, scale: int) -> torch.Tensor:
    return local_sum * (scale / total.clamp(min=1)).to(local_sum.dtype)


def _mean(summed, total, dtype) -> torch.Tensor:
    return (summed / total.clamp(min=1)).to(dtype)


class GlobalBatch:
    """What a training step adds on several ranks; nothing on one. In step order:

    count(targets, device)  after the copy: this rank's boxes, all-reduced in the background
    loss(loss)              what this rank backpropagates (waits for the count)
    after_backward()        with reduce_after (--no-overlap): every gradient all-reduced
    shown(loss)             the global batch's loss (waits for the sums' all-reduce)

    averaged: the gradient reduction averages (scale N), else it sums (scale 1)."""

    def __init__(self, loss_name: str, ranks=None, model=None, reduce_after: bool = False,
                 averaged: bool = True):
        from training.ranks import Ranks
        self.loss_name, self.ranks = loss_name, ranks or Ranks()
        self.model, self.reduce_after = model, reduce_after
        self.scale = self.ranks.world if averaged else 1
        self._boxes = self._total = self._summed = None
        self._works = []

    @classmethod
    def of(cls, spread, ranks, model) -> "GlobalBatch":
        """A run's: its gradients reduced after the backward with --no-overlap in train
        mode, the loss scaled for the reduction training/ddp.py chose."""
        from training.ddp import averages, reduction
        return cls(spread.loss, ranks, model, reduce_after=reduction(spread, ranks) == "after",
                   averaged=averages(spread))

    def count(self, targets, device) -> None:
        if not self.ranks.distributed:
            return
        self._boxes = local_boxes(self.loss_name, targets, device)
        self._total = self._boxes.double()
        self._works = [dist.all_reduce(self._total, async_op=True)]

    def loss(self, loss: torch.Tensor) -> torch.Tensor:
        if not self.ranks.distributed:
            return loss
        self._works.pop(0).wait()  # NCCL: the current stream waits; no host sync
        local_sum = _local_sum(loss, self._boxes)
        self._summed = local_sum.detach().double()
        self._works.append(dist.all_reduce(self._summed, async_op=True))
        return _backpropagated(local_sum, self._total, self.scale)

    def after_backward(self) -> None:
        if self.reduce_after:
            from training.ddp import reduce_after_backward
            reduce_after_backward(self.model)

    def shown(self, loss: torch.Tensor) -> torch.Tensor:
        if not self.ranks.distributed:
            return loss
        self._works.pop(0).wait()
        shown = _mean(self._summed, self._total, loss.dtype)
        self._boxes = self._total = self._summed = None
        return shown
