"""DistributedDataParallel around the model on several ranks, and its knobs (bucket_mb,
bucket_view, comm_hook, overlap), each a train.Config switch recorded in summary.json.
Nothing here imports torch at import time. The design in full: docs/design.md, this
module's section."""

from core.errors import UserError

HELP = {
    "bucket_mb": "several GPUs: DDP's gradient bucket size in MB",
    "bucket_view": "several GPUs: DDP's gradient_as_bucket_view (gradients are views of the "
                   "all-reduce buckets: no copy in or out)",
    "comm_hook": "several GPUs: DDP communication hook: none (DDP averages), sum (sums; the "
                 "loss is scaled instead: no division pass), bf16 (buckets all-reduced as bf16)",
    "overlap": "several GPUs: all-reduce gradients during the backward (DDP); off: after it, "
               "without DDP",
}
COMM_HOOKS = ("none", "sum", "bf16")


def check(spread) -> None:
    """The knobs' values, before anything is written."""
    if not spread.bucket_mb > 0:
        raise UserError(f"--bucket-mb must be a positive number, got {spread.bucket_mb}")
    if spread.comm_hook not in COMM_HOOKS:
        raise UserError(f"--comm-hook takes {' or '.join(COMM_HOOKS)}, not {spread.comm_hook!r}")
    if spread.comm_hook == "bf16" and not spread.overlap:
        raise UserError("--comm-hook bf16 is a DDP hook and --no-overlap runs without DDP "
                        "(its all-reduces sum, as --comm-hook sum): use one")


def knobs(spread) -> dict:
    """The knobs as summary.json records them."""
    return {name: getattr(spread, name) for name in HELP}


def wrapper(spread, ranks, device) -> tuple:
    """(wrap, wrap_key) for model/build.py: the function that wraps the model, and what
    the kept model of make compare must match to be reused."""
    return (lambda model: wrap(model, spread, ranks, device),
            # one process: the model itself in both modes; several: DDP in train mode only
            (ranks.world, spread.mode if ranks.distributed else None, spread.parallel,
             *knobs(spread).values()))


def reduction(spread, ranks) -> str | None:
    """How a run's gradients are reduced over the ranks: "ddp" (DDP, during the backward),
    "after" (--no-overlap: after it, without DDP), or None (one rank, or forward mode:
    no gradients to reduce)."""
    if not (ranks.distributed and spread.mode == "train"):
        return None
    return "ddp" if spread.overlap else "after"


def wrap(model, spread, ranks, device):
    """The module the step runs: lin1 sharded as --parallel says (training/parallel.py),
    then DDP around the model where reduction() says so, leaving alone what the design
    owns; else the model itself."""
    from training.parallel import shard
    owned = shard(model, spread, ranks, device)
    if reduction(spread, ranks) != "ddp":
        return model
    import warnings

    from torch.nn.parallel import DistributedDataParallel
    if owned:  # DDP would all-reduce them, and broadcast rank 0's rows to every rank
        DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(model, owned)
    # With bucket views, the channels_last conv weights' gradients (NHWC strides) are
    # copied into their contiguous buckets, and autograd warns each step; those are a few
    # thousand elements, lin1's 1.07 B are views as meant.
    warnings.filterwarnings("ignore", message="Grad strides do not match bucket view strides")
    ddp = DistributedDataParallel(
        model, device_ids=[device.index] if device.type == "cuda" else None,
        bucket_cap_mb=spread.bucket_mb, gradient_as_bucket_view=spread.bucket_view,
        **no_buffer_broadcast())
    without_runtime_stats(ddp)
    if spread.comm_hook == "bf16":
        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        ddp.register_comm_hook(None, default_hooks.bf16_compress_hook)
    elif spread.comm_hook == "sum":
        ddp.register_comm_hook(None, allreduce_sum_hook)
    return ddp


class _NoRuntimeStats:
    """DDP's logger with its runtime sampling taken out; every other call passes through."""

    def __init__(self, logger):
        self._logger = logger

    def set_runtime_stats_and_log(self) -> None:
        pass

    def __getattr__(self, name):
        if name == "_logger":  # a copy made without __init__: no recursion
            raise AttributeError(name)
        return getattr(self._logger, name)


def without_runtime_stats(ddp) -> None:
    """DDP's forward samples its runtime stats in the first 10 steps and every 100th
    after: each sample reads CUDA events back to the host, 8 cudaEventSynchronize calls
    (host-device syncs) at the start of a sampled forward, seen in the sync column of
    make profile GPUS=2. A sync drains the queue the host keeps ahead, so the GPU idles
    while the forward is dispatched again. The stats feed only DDP's own logging, which
    nothing here reads."""
    ddp.logger = _NoRuntimeStats(ddp.logger)


def no_buffer_broadcast() -> dict:
    """DDP's argument that stops the buffers' broadcast before each forward. The only
    buffer is --bf16-shadow's fp32 master of lin1 (4.3 GB): every rank makes the same
    update to it, so broadcasting it each step would only cost. torch 2.13 renamed the
    argument (forward_sync_buffers) and warns at the old one, which torch 2.11 needs."""
    import inspect

    from torch.nn.parallel import DistributedDataParallel
    if "forward_sync_buffers" in inspect.signature(DistributedDataParallel).parameters:
        return {"forward_sync_buffers": False}
    return {"broadcast_buffers": False}


def averages(spread) -> bool:
    """Whether the gradient reduction averages over the ranks (DDP's own, its bf16 hook)
    or sums (the sum hook, --no-overlap); training/distributed.py scales the loss for it."""
    return spread.overlap and spread.comm_hook != "sum"


def allreduce_sum_hook(process_group, bucket):
    """A DDP communication hook that sums the bucket over the ranks, without DDP's
    division by their number (a pass over every gradient: 4.3 GB read and written for
    lin1's 2.1 GB); the loss is scaled for a sum instead (training/distributed.py)."""
    import torch.distributed as dist
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda fut: fut.value()[0])


def reduce_after_backward(model) -> None:
    """--no-overlap: every gradient summed over the ranks once the backward is done (the
    loss is scaled for a sum), none of it hidden behind the backward."""
    import torch.distributed as dist

    from training.parallel import is_sharded
    for p in model.parameters():
        # A sharded parameter's gradient (--parallel zero or tp) is reduced by its design.
        if p.grad is not None and not is_sharded(p):
            dist.all_reduce(p.grad)
