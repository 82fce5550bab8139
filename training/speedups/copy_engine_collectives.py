"""Under --parallel tp, the features' all-gather and dx's reduce-scatter moved by the copy
engines between symmetric-memory buffers, ordered by flags the GPU's front end sets and
waits on, with no kernel (training/peer_copies.py), so the GEMMs beside them keep every
SM (no carveout: --sms-for-collectives idles).

Why: NCCL's kernels cannot share an SM with cuBLAS's persistent GEMMs, and the carveout
that makes room for them slows those GEMMs for all their length. The same sums (two ranks:
NCCL's bit for bit). Off by default: NCCL's watchdog does not see these copies, and the
failure promises on NCCL ranks (tests/training/test_gpu_failures.py) are proven with NCCL's
collectives; measured: results/several-gpus.md.
"""

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
    return None if hasattr(symm, "empty") else "this torch has no symmetric memory"


SPEEDUP = SpeedUp(
    "copy_engine_collectives",
    "under --parallel tp on one host's GPUs, lin1's all-gather and reduce-scatter moved by "
    "the copy engines with no kernel, so the GEMMs beside them keep every SM: "
    "auto (tp on a GPU), on, or off, the default",
    default="off", gpu_only=True, several_ranks=True, refusal=refusal,
    process=swap_collectives)
