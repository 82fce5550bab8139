"""Under --parallel tp, the features' all-gather and dx's reduce-scatter moved by the copy
engines between symmetric-memory buffers, ordered by flags the GPU's front end sets and
waits on, with no kernel (training/peer_copies.py): NCCL's kernels cannot share an SM with
cuBLAS's persistent GEMMs, and the GEMMs beside them here keep every SM. The same sums; auto
where it was measured faster. The design in full: docs/design.md, this module's section."""

from training.speedups.base import SpeedUp


def swap_collectives(on: bool, cuda: bool, many_runs: bool) -> None:
    """Every run sets tp's two big collectives: the copy engines' where this is on, NCCL's
    where off (a process of several runs, make compare's, gets each run's own)."""
    from training import tensor_parallel
    if not (on and cuda):
        tensor_parallel.COLLECTIVES = tensor_parallel.Collectives()
        return
    from training import peer_copies
    tensor_parallel.COLLECTIVES = tensor_parallel.Collectives(
        peer_copies.gather, peer_copies.scatter_buffer, peer_copies.scatter)


def refusal(asked, cuda: bool) -> str | None:
    if asked.design != "tp":
        return "only --parallel tp gathers lin1's input and scatters its gradient"
    try:
        from torch.distributed import _symmetric_memory as symm
    except ImportError:
        symm = None
    if not hasattr(symm, "empty"):
        return "this torch has no symmetric memory"
    from training.ranks import hosts
    if (hosts() or 1) > 1:
        return f"moves rows between one host's GPUs: this job spans {hosts()} hosts"
    if cuda and not _peers_reach_each_other(asked.world):
        return "these GPUs cannot reach each other's memory (no peer access)"
    return None


def _peers_reach_each_other(world: int) -> bool:
    """Whether each of the job's GPUs (rank r on GPU r: training/ranks.py) can read and
    write every other's memory, as the copies between symmetric-memory buffers need."""
    import torch
    gpus = range(min(world, torch.cuda.device_count()))
    return all(torch.cuda.can_device_access_peer(a, b) for a in gpus for b in gpus if a != b)


def measured_faster(asked) -> str | None:
    """auto: on where measured faster than NCCL's collectives (two GPUs); elsewhere off."""
    if asked.world == 2:
        return None
    return f"measured faster on two GPUs only, not yet on {asked.world}"


SPEEDUP = SpeedUp(
    "copy_engine_collectives",
    "under --parallel tp on one host's GPUs, lin1's all-gather and reduce-scatter moved by "
    "the copy engines with no kernel, so the GEMMs beside them keep every SM: "
    "auto (the default: on where measured faster, tp on two GPUs), on, or off",
    default="auto", gpu_only=True, several_ranks=True, refusal=refusal,
    auto_off=measured_faster, process=swap_collectives)
