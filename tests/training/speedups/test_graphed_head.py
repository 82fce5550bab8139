"""--graphed-head on NCCL ranks (make test-gpu; a group of one on a one-GPU machine, two
ranks on two): tp's sharded head replayed as CUDA graphs gives the eager sharded head's
outputs and gradients bit for bit over steps whose inputs and weights change, under bf16
autocast, with no warning, and a batch of another size runs the eager head."""

import gc
import warnings

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(),
                                                  reason="CUDA graphs need a CUDA GPU")]
BATCH, FEATURES, HIDDEN, OUT, STEPS = 16, 256, 64, 24, 4


def _sharded_head(seed: int, group):
    from training.tensor_parallel import parallelize_head
    torch.manual_seed(seed)
    head = torch.nn.Module()
    head.lin1 = torch.nn.Linear(FEATURES, HIDDEN)
    head.lin2 = torch.nn.Linear(HIDDEN, OUT)
    head.cuda()
    parallelize_head(head, group)
    return head


def _steps(head, call, xs, dzs) -> list[torch.Tensor]:
    """Outputs and every gradient of STEPS steps, each followed by an SGD update in place
    (as the run's optimizers update: the graph reads the weights where they are)."""
    params = [head.lin1.weight, head.lin1.bias, head.lin2.weight, head.lin2.bias]
    got = []
    for x, dz in zip(xs, dzs, strict=True):
        x = x.clone().requires_grad_()
        with torch.autocast("cuda", dtype=torch.bfloat16):
            z = call(x)
        z.backward(dz.to(z.dtype))
        got += [z.detach().clone(), x.grad.clone(), *(p.grad.clone() for p in params)]
        with torch.no_grad():
            for p in params:
                p.sub_(0.1 * p.grad)
                p.grad = None
    return got


def _rank(rank: int, world: int, folder: str, seed: int) -> None:
    import torch.distributed.nn.functional  # noqa: F401  (tests/training/test_tensor_parallel.py says why)
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", init_method=f"file://{folder}/store", rank=rank,
                            world_size=world)
    try:
        with warnings.catch_warnings(record=True) as warned:
            warnings.simplefilter("always")
            _compare(rank, folder, seed)
        torch.save([str(w.message)[:200] for w in warned], f"{folder}/warned{rank}.pt")
        gc.collect()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _compare(rank: int, folder: str, seed: int) -> None:
    from training.speedups.graphed_head import GraphedHead
    make = torch.Generator(device="cuda").manual_seed(seed + rank)
    xs = [torch.randn(BATCH, FEATURES, device="cuda", generator=make) for _ in range(STEPS)]
    dzs = [torch.randn(BATCH, OUT, device="cuda", generator=make) for _ in range(STEPS)]
    eager_head = _sharded_head(seed, dist.group.WORLD)
    eager = _steps(eager_head, lambda x: eager_head.lin2(torch.relu(eager_head.lin1(x))),
                   xs, dzs)
    head = _sharded_head(seed, dist.group.WORLD)
    # As DDP does: lin2's bias's gradient accumulator, made before the capture and kept.
    kept = head.lin2.bias.view_as(head.lin2.bias).grad_fn.next_functions[0][0]
    graphed = GraphedHead(lambda x: head.lin2(torch.relu(head.lin1(x))), lambda: [
        (head.lin1, "weight"), (head.lin1, "bias"), (head.lin2, "weight"),
        (head.lin2, "bias")])
    replayed = _steps(head, graphed, xs, dzs)
    # A batch of half the size: the eager head, not the graphs.
    halves = [xs[0][: BATCH // 2]], [dzs[0][: BATCH // 2]]
    short = _steps(head, graphed, *halves)
    short_eager = _steps(eager_head, lambda x: eager_head.lin2(torch.relu(eager_head.lin1(x))),
                         *halves)
    del kept
    torch.save({"eager": [t.cpu() for t in eager + short_eager],
                "graphed": [t.cpu() for t in replayed + short],
                "captured": graphed.x is not None}, f"{folder}/rank{rank}.pt")


def test_the_replayed_head_is_the_eager_head_bit_for_bit(tmp_path):
    world = min(2, torch.cuda.device_count())
    seed = int(torch.randint(0, 2**31 - 1, ()).item())
    mp.spawn(_rank, args=(world, str(tmp_path), seed), nprocs=world)
    for rank in range(world):
        got = torch.load(tmp_path / f"rank{rank}.pt")
        assert got["captured"]
        # Nothing said at any step (a gradient crossing streams into an accumulator of
        # the capture's stream was a warning a step).
        assert torch.load(tmp_path / f"warned{rank}.pt") == []
        assert len(got["graphed"]) == len(got["eager"]) == 6 * (STEPS + 1)
        for i, (g, e) in enumerate(zip(got["graphed"], got["eager"], strict=True)):
            assert g.dtype == e.dtype and torch.equal(g, e), (seed, rank, i)
