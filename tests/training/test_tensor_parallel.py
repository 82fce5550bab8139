"""training/tensor_parallel.py on two gloo ranks: the sharded head's output rows and every
gradient (the features', each shard's, lin2's replicated bias summed over the ranks) are
the whole head's on the global batch, in fp32 and under bf16 autocast, at odd shapes, on
fresh random inputs each run."""

import gc

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 2
BATCH, FEATURES, HIDDEN, OUT = 3, 10, 6, 5  # a rank's batch; lin1 F -> H, lin2 H -> O


def _head(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    head = torch.nn.Module()
    head.lin1 = torch.nn.Linear(FEATURES, HIDDEN)
    head.lin2 = torch.nn.Linear(HIDDEN, OUT)
    return head


def _run(head, x, autocast: bool):
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        z = head.lin2(torch.relu(head.lin1(x)))
    return z


def _rank(rank: int, folder: str, seed: int, autocast: bool) -> None:
    # As training/ranks.py does before its group: imported after it, these functions bind
    # the default group for the process's life, and so do the sharded head and its saved
    # autograd contexts while they live. Then destroy_process_group cannot free it, gloo's
    # threads outlive the interpreter, and a rank aborted at exit ('terminate called without
    # an active exception', 5 runs in 22 on 2 cores).
    import torch.distributed.nn.functional  # noqa: F401
    dist.init_process_group("gloo", init_method=f"file://{folder}/store", rank=rank,
                            world_size=WORLD)
    try:
        _compare(rank, folder, seed, autocast)  # its tensors and modules freed on return
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _compare(rank: int, folder: str, seed: int, autocast: bool) -> None:
    from training.tensor_parallel import parallelize_head
    whole = _head(seed)
    x = torch.randn(WORLD * BATCH, FEATURES, generator=torch.Generator().manual_seed(seed))
    x_whole = x.clone().requires_grad_()
    z_whole = _run(whole, x_whole, autocast)
    dz = torch.randn(z_whole.shape, generator=torch.Generator().manual_seed(seed + 1))
    z_whole.backward(dz.to(z_whole.dtype))

    sharded = _head(seed)
    shards = parallelize_head(sharded, dist.group.WORLD)
    mine = slice(rank * BATCH, (rank + 1) * BATCH)
    x_mine = x[mine].clone().requires_grad_()
    z_mine = _run(sharded, x_mine, autocast)
    z_mine.backward(dz[mine].to(z_mine.dtype))
    bias_grad = sharded.lin2.bias.grad.clone()
    dist.all_reduce(bias_grad)  # replicated: DDP sums it in the run

    rows = slice(rank * HIDDEN // WORLD, (rank + 1) * HIDDEN // WORLD)
    pairs = {
        "output": (z_mine, z_whole[mine]),
        "features' gradient": (x_mine.grad, x_whole.grad[mine]),
        "lin1 weight's gradient": (sharded.lin1.weight.grad, whole.lin1.weight.grad[rows]),
        "lin1 bias's gradient": (sharded.lin1.bias.grad, whole.lin1.bias.grad[rows]),
        "lin2 weight's gradient": (sharded.lin2.weight.grad,
                                   whole.lin2.weight.grad[:, rows]),
        "lin2 bias's gradient, summed": (bias_grad, whole.lin2.bias.grad),
    }
    got = {name: (a.detach().float(), b.detach().float()) for name, (a, b) in pairs.items()}
    torch.save({"pairs": got, "shards": [tuple(p.shape) for p in shards]},
               f"{folder}/rank{rank}.pt")


@pytest.mark.parametrize("autocast", [False, True], ids=["fp32", "bf16-autocast"])
def test_the_sharded_head_is_the_whole_head_on_the_global_batch(tmp_path, autocast):
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    mp.spawn(_rank, args=(str(tmp_path), seed, autocast), nprocs=WORLD)
    # bf16 GEMMs round differently over H/N than over H, and the partial sums are summed
    # in bf16 by the reduce-scatter: bf16's few places, against fp32's.
    rel, abs_ = (3e-2, 3e-2) if autocast else (1e-5, 1e-6)
    for rank in range(WORLD):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["shards"] == [(HIDDEN // WORLD, FEATURES), (HIDDEN // WORLD,),
                                 (OUT, HIDDEN // WORLD)]
        for name, (sharded, whole) in got["pairs"].items():
            assert sharded.shape == whole.shape, (rank, name)
            assert torch.allclose(sharded, whole, rtol=rel, atol=abs_), \
                (seed, rank, name, (sharded - whole).abs().max().item())
