"""--parallel: how the step is spread over N ranks (make profile GPUS=N). ddp, zero, tp and
tp2d differ in what they do with lin1 (98 % of the parameters): docs/several-gpus.md's
table ("Spreading lin1"). Every design sums the gradients over the ranks, so the trunk's
reduction must be a sum too. Nothing here imports torch at import time. The design in
full: docs/design.md, this module's section."""

import weakref

from core.errors import UserError
from training.ranks import hosts, per_host

PARALLEL = ("ddp", "zero", "tp", "tp2d")
CHOICES = ("auto", *PARALLEL)
HELP = ("several GPUs: auto (tp on one host, tp2d across hosts, where they apply, else "
        "ddp; the run's first lines say which and why), ddp (lin1 replicated, its gradient "
        "all-reduced), zero (lin1's weight, gradient, master and momentum sharded by rows: "
        "FSDP2), tp (lin1 column- and lin2 row-parallel, features all-gathered), tp2d (tp "
        "inside each host, data-parallel across hosts)")
# The buffer that --bf16-shadow adds for lin1's fp32 master (training/speedups/
# bf16_shadow.py), and the two --split-master holds it in instead: its int16 low half and
# its tie bits (training/speedups/split_master.py).
MASTER = "lin1_master"
MASTER_LOW = "lin1_master_low"
MASTER_TIES = "lin1_master_ties"
# tp's shards (training/tensor_parallel.py), plain parameters told apart by identity:
# id -> a weak reference (a WeakSet compares tensors with ==, which is elementwise).
_SHARDS: dict = {}


def master_names(model) -> list[str]:
    """The buffers that hold lin1's master in this model ([] without --bf16-shadow)."""
    return [name for name in (MASTER, MASTER_LOW, MASTER_TIES) if hasattr(model, name)]


def check(spread, world: int) -> None:
    """Where a design given cannot apply: one line, before anything is written (auto
    takes the next design that can)."""
    if spread.parallel not in CHOICES:
        raise UserError(f"--parallel takes {', '.join(CHOICES)}, not {spread.parallel!r}")
    reason = None if spread.parallel == "auto" else _refusal(spread.parallel, spread, world)
    if reason:
        raise UserError(f"--parallel {spread.parallel} {reason}")


def choose(spread, world: int) -> tuple[str, str]:
    """(the design this run uses, why): the one given, or for auto the fastest measured
    that can apply (PREFERRED: tp inside a host, tp2d across hosts), else ddp."""
    if spread.parallel != "auto":
        return spread.parallel, "given"
    if world < 2:
        return "ddp", "auto: one rank, nothing to spread"
    several_hosts = (hosts() or 1) > 1
    best = "tp2d" if several_hosts else "tp"
    reason = _refusal(best, spread, world)
    if reason is None:
        return best, f"auto: {PREFERRED[best]}"
    return "ddp", f"auto: ddp, because --parallel {best} {reason}"


# Why auto picks each (the measurements: results/several-gpus.md).
PREFERRED = {
    "tp": "tp, the fastest design measured on 2 and 4 GPUs of one host "
          "(results/several-gpus.md); --parallel ddp or zero for another",
    "tp2d": "tp2d, tp inside each host and data-parallel across hosts, the cost model's "
            "choice across hosts (unmeasured: docs/several-gpus.md)",
}


def _refusal(design: str, spread, world: int) -> str | None:
    """Why a design cannot apply to this run, or None."""
    if design == "ddp":
        return None
    if world < 2:
        return ("shards lin1 over several ranks: run it with GPUS=N (N >= 2), or use "
                "--parallel ddp on one")
    parts = world
    if design == "tp2d":
        parts = per_host()
        # A host of 1 in a job of 3 on 2 hosts divides 3 too: the host count tells.
        if world % parts or (hosts() or world // parts) * parts != world:
            return (f"needs the same number of ranks on every host: this host runs {parts} "
                    f"of the job's {world}")
    if spread.hidden % parts:
        over = "each host's" if parts != world else "the"
        return (f"splits lin1's {spread.hidden} rows evenly over {over} ranks: --hidden must "
                f"be a multiple of {parts}")
    if spread.overlap and spread.comm_hook != "sum":
        return (f"sums gradients over the ranks (the head's sharded gradients are sums "
                f"already): use --comm-hook sum (the default), not {spread.comm_hook}")
    return None


def sharded(spread, ranks) -> bool:
    """Whether this run shards lin1 (a design other than ddp, on several ranks)."""
    return ranks.distributed and spread.parallel != "ddp"


def shard(model, spread, ranks, device) -> list[str]:
    """Applies the design to the model in place, before DDP wraps it; returns the names of
    the parameters and buffers DDP must leave alone (sharded, or already the global
    batch's). Every rank built the same model from the same seed, so each keeps its own
    rows of the same full tensors."""
    if not sharded(spread, ranks):
        return []
    from torch.distributed.device_mesh import init_device_mesh
    if spread.parallel == "tp2d":
        # torchrun numbers the ranks host by host: row h of the mesh is host h.
        g = per_host()
        mesh = init_device_mesh(device.type, (ranks.world // g, g), mesh_dim_names=("dp", "tp"))
        return apply(model, "tp2d", mesh, ranks)
    mesh = init_device_mesh(device.type, (ranks.world,), mesh_dim_names=("shard",))
    return apply(model, spread.parallel, mesh, ranks)


def apply(model, design: str, mesh, ranks) -> list[str]:
    """shard()'s work on a given mesh (bench/sharded_rank.py applies it on a world of one
    to time a rank's work without the collectives)."""
    parts, index = ranks.world, ranks.rank
    if design == "zero":
        _fully_shard_lin1(model, mesh)
    elif design == "tp":
        _tensor_parallel_head(model, mesh)
    elif design == "tp2d":
        _tensor_parallel_head(model, mesh["tp"])
        _sum_across_hosts(model, mesh["dp"])
        parts, index = mesh["tp"].size(), mesh["tp"].get_local_rank()
    if master_names(model):
        _keep_local_master_rows(model, parts, index)
    return _left_to_the_design(model)


def _fully_shard_lin1(model, mesh) -> None:
    from torch.distributed.fsdp import fully_shard
    # The weight alone: under --bf16-shadow it is bf16 and the bias fp32, and FSDP2 gathers
    # one dtype per module; the bias (16 K elements) stays with DDP. Kept unsharded from
    # the forward to the end of the backward (one gather a step, not two).
    fully_shard(model.lin1, mesh=mesh, reshard_after_forward=False,
                ignored_params={model.lin1.bias})
    # Sums, as DDP's sum hook does: NCCL's reduce-scatter pre-multiplies by 1. gloo has no
    # pre-multiplied sum, so there FSDP2 sums and divides after (a pass over the shard,
    # which torch 2.13 skips for a factor of 1 and 2.11 may not).
    import torch.distributed as dist
    model.lin1.set_gradient_divide_factor(1.0)
    if dist.get_backend() == "gloo":
        model.lin1.set_force_sum_reduction_for_comms(True)


def _tensor_parallel_head(model, mesh) -> None:
    from training.tensor_parallel import parallelize_head
    for shard in parallelize_head(model, mesh.get_group()):
        _SHARDS[id(shard)] = weakref.ref(shard)
    # Only the trunk (the convolutions) is compiled; the head runs eager: its collectives
    # wait on async work handles, which the compiler does not trace, and it is three
    # cuBLAS GEMMs and a ReLU, nothing for the compiler to fuse.
    model.compile_whole = False


def _sum_across_hosts(model, dp_mesh) -> None:
    """tp2d: each head shard's gradient holds its host's batch; summed here over the ranks
    that hold the same shard on the other hosts, as each is made in the backward (NCCL
    enqueues it on the stream: no host wait). Nothing to do on one host."""
    if dp_mesh.size() == 1:
        return
    import torch.distributed as dist
    group = dp_mesh.get_group()

    def summed(param):
        dist.all_reduce(local(param.grad), group=group)
    for param in model.parameters():
        if is_sharded(param):
            param.register_post_accumulate_grad_hook(summed)


def _keep_local_master_rows(model, parts: int, index: int) -> None:
    """The master of lin1's weight (fp32, or its low half and tie bits: a row's bits are
    its own words), cut to this rank's rows: the rows of the bf16 weight's local shard
    (Shard(0), even chunks: check() asks for it), the index-th of `parts` (the world's
    under zero and tp, the host's under tp2d)."""
    for name in master_names(model):
        rows = getattr(model, name).chunk(parts)[index].clone()
        setattr(model, name, rows)  # the full master is freed here: 4.3 GB at full size


def _left_to_the_design(model) -> list[str]:
    names = [n for n, p in model.named_parameters() if is_sharded(p)]
    return names + master_names(model)


def prefetcher(spread, ranks, model):
    """What runs before each forward, outside the compiled model: under zero, lin1's
    all-gather started, so that it runs beside the conv forward (FSDP2's pre-forward
    hook then only waits for it); nothing otherwise."""
    if not (sharded(spread, ranks) and spread.parallel == "zero"):
        return lambda: None
    lin1 = model.lin1
    return lambda: lin1.unshard(async_op=True)


def local(tensor):
    """A sharded tensor's local part (its rows on this rank), or the tensor itself."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def is_sharded(tensor) -> bool:
    """A parameter that the design owns: a DTensor (zero's), or one of tp's shards."""
    from torch.distributed.tensor import DTensor
    mine = _SHARDS.get(id(tensor))
    return isinstance(tensor, DTensor) or (mine is not None and mine() is tensor)
