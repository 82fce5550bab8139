"""Where this process stands in a torchrun job (make profile GPUS=N, training/launch.py):
its rank, the world, its device, and the little the ranks tell each other outside the
training step (the run folder's name, each rank's summary at the end).

A process that torchrun did not start (no WORLD_SIZE, or 1) is a world of one: nothing
here touches torch.distributed then, and the run is exactly the single-process one.
"""

import os
import sys
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

# The launcher's folder where each rank leaves its one-line error (training/launch.py).
ERRORS_ENV = "RAGGED_RANK_ERRORS"


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that prints, names the run folder and writes the summary."""
        return self.rank == 0

    def device(self, cuda: bool):
        """This rank's device: GPU local_rank (made current, so that every "cuda" tensor
        lands there), or the CPU."""
        import torch
        if not cuda:
            return torch.device("cpu")
        torch.cuda.set_device(self.local_rank)
        return torch.device("cuda", self.local_rank)

    def start(self, cuda: bool):
        """This rank's device, and the process group joined: NCCL between GPUs, gloo
        between CPU processes. Joined once per process (make compare runs many runs)."""
        import torch.distributed as dist
        device = self.device(cuda)
        if self.distributed and not dist.is_initialized():
            _bind_defaults_before_the_group()
            # The step's collectives finish in milliseconds; a rank that waits minutes is
            # waiting for a dead peer, which torchrun kills sooner anyway.
            dist.init_process_group("nccl" if cuda else "gloo", timeout=timedelta(minutes=5))
        return device

    def share(self, value):
        """Rank 0's value, on every rank (a picklable object; a collective: every rank
        calls it at the same point)."""
        if not self.distributed:
            return value
        import torch.distributed as dist
        box = [value]
        dist.broadcast_object_list(box, src=0)
        return box[0]

    def gather(self, value) -> list:
        """Every rank's value, in rank order, on every rank (a collective)."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist
        out = [None] * self.world
        dist.all_gather_object(out, value)
        return out

    def worker_name(self) -> str:
        """The trace's worker name: TensorBoard's plugin tells the ranks apart by it."""
        return f"rank{self.rank}" if self.distributed else "train"

    def leave_error(self, line: str) -> bool:
        """Leaves this rank's one-line error for the launcher, which prints the line of
        the rank that failed first; False when no launcher asked for it."""
        folder = os.environ.get(ERRORS_ENV)
        if not (self.distributed and folder):
            return False
        Path(folder, f"rank{self.rank}.txt").write_text(line + "\n")
        return True


def _bind_defaults_before_the_group() -> None:
    """Imports torch.distributed.nn.functional while no group exists. Its functions take
    `group=group.WORLD` as a default argument, bound at import: imported after
    init_process_group (DDP's constructor imports torch._dynamo, which imports it), they
    hold the default group for the process's life, so destroy_process_group cannot free
    it. Gloo's worker threads then outlive stop() and free their last work during the
    interpreter's shutdown; that work still holds the tensors of the summaries' gather,
    whose release needs the GIL, and the rank aborts ('terminate called without an active
    exception', 1 run in ~20 on 2 CPU cores, seen in a core dump). Imported first, the
    defaults are None, and destroy_process_group joins the threads while Python lives."""
    import torch.distributed.nn.functional  # noqa: F401


def from_env() -> Ranks:
    """This process's place, from the variables torchrun sets."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks()
    return Ranks(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


def per_host() -> int:
    """The ranks on this host (torchrun's LOCAL_WORLD_SIZE; the whole world without it)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


def stop() -> None:
    """Leaves the process group after a job that ended well, once every rank is done with
    it (torch may not even be installed: train.py --help), and frees it: gloo's threads
    end here, not in the interpreter's shutdown (_bind_defaults_before_the_group says
    why that matters). After an early end nothing is waited for: torchrun stops the job."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        _forget_what_holds_the_group()
        dist.barrier()
        dist.destroy_process_group()


def _forget_what_holds_the_group() -> None:
    """Drops the model that make compare keeps between its runs (model/build.py): it is
    kept with its runner, the DDP wrapper, which holds the process group, so the group
    outlived destroy_process_group and gloo's threads the interpreter (one make compare
    rank in ~20 aborted at exit: 'terminate called without an active exception')."""
    build = sys.modules.get("model.build")  # loaded only where a model was built
    if build is not None:
        import gc
        build.forget_kept_model()
        # Dropping the reference frees DDP on CPU ranks (tested); a compiled runner may
        # sit in reference cycles, which are freed here rather than at exit.
        gc.collect()
