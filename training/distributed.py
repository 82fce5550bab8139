"""Several ranks, one global batch: what each rank of a torchrun + DistributedDataParallel
job needs so that N ranks with batch b train exactly as one process with batch N*b
(train.py runs it under torchrun: `make profile GPUS=N`, training/launch.py).

- Data: RankShare gives rank r the samples r*b .. r*b+b-1 of each global batch of N*b, in
  the one-process order (the loader keeps its batch size b, in order).
- Loss: every strategy returns sum(terms) / max(local boxes, 1). The global batch's loss
  is sum over ranks of the sums / max(global boxes, 1); DDP averages the ranks'
  gradients, so each rank backpropagates N * local sum / max(global boxes, 1), and the
  average is the one-process gradient. The two numbers the ranks share (their sums and
  box counts) are all-reduced as one tensor on the loss's device: asynchronous on NCCL,
  no host-device sync.
"""

import torch
import torch.distributed as dist
from torch.utils.data import Sampler

from core.names import RAGGED


class RankShare(Sampler):
    """Rank `rank`'s indices of each global batch of world * batch samples, in order; the
    last incomplete global batch is dropped, as the one-process loader drops it."""

    def __init__(self, length: int, batch: int, rank: int, world: int):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside a world of {world}")
        self.length, self.batch, self.rank, self.world = length, batch, rank, world

    def __len__(self) -> int:
        return self.length // (self.batch * self.world) * self.batch

    def __iter__(self):
        step = self.batch * self.world
        for start in range(0, self.length - step + 1, step):
            first = start + self.rank * self.batch
            yield from range(first, first + self.batch)


def local_boxes(loss_name: str, targets, device) -> torch.Tensor:
    """This rank's valid boxes as a 0-d tensor on the device, without a host sync: the
    padded layouts' counts summed there; the ragged lists' lengths are host metadata,
    filled into a device scalar (a fill kernel, no copy)."""
    if loss_name in RAGGED:
        return torch.full((), sum(int(t.shape[0]) for t in targets), dtype=torch.int64,
                          device=device)
    return targets[1].sum(dtype=torch.int64)


def global_mean(loss: torch.Tensor, boxes: torch.Tensor,
                group=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(what this rank backpropagates, the global batch's loss) from this rank's loss
    (sum / max(boxes, 1)) and its box count; see the module's docstring."""
    world = dist.get_world_size(group)
    local_sum = loss * boxes.clamp(min=1).to(loss.dtype)
    shared = torch.stack([local_sum.detach().double(), boxes.double()])
    dist.all_reduce(shared, group=group)
    denominator = shared[1].clamp(min=1)
    scaled = local_sum * (world / denominator).to(loss.dtype)
    return scaled, (shared[0] / denominator).to(loss.dtype)


class GlobalBatch:
    """What a training step adds on several ranks; nothing on one.

    loss(): the global batch's loss (shown) and what this rank backpropagates;
    after_backward(): with reduce_after (--no-overlap), every gradient all-reduced now."""

    def __init__(self, loss_name: str, ranks=None, model=None, reduce_after: bool = False):
        from training.ranks import Ranks
        self.loss_name, self.ranks = loss_name, ranks or Ranks()
        self.model, self.reduce_after = model, reduce_after

    def loss(self, loss: torch.Tensor, targets, device) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.ranks.distributed:
            return loss, loss
        return global_mean(loss, local_boxes(self.loss_name, targets, device))

    def after_backward(self) -> None:
        if self.reduce_after:
            from training.ddp import reduce_after_backward
            reduce_after_backward(self.model, self.ranks.world)
