"""training/distributed.py: two gloo ranks with DistributedDataParallel, each on its share of
a global batch, give the loss and every parameter's gradient of one process over that
whole batch (padded, concat, the Triton kernel in its interpreter, and the packed
layouts: the packed kernel and nested)."""

import copy
import os
import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import losses
from data import SyntheticFaces
from model import build_model
from training.distributed import GlobalBatch, RankShare, local_boxes
from training.ranks import Ranks, stop

STRATEGIES = [("padded", "triton"), ("concat", "triton"), ("kernel", "triton"),
              ("packed", "triton"), ("nested", "triton")]
PER_RANK, WORLD, SIGMA = 3, 2, 4.0


def _setup(name: str, backend: str, seed: int):
    model, _ = build_model(32, 16, 32, False, seed, torch.device("cpu"))
    return model, losses.get(name, backend, capacity=16), SyntheticFaces(100, 32, seed,
                                                                          box_sigma=SIGMA)


def _rank(rank: int, port: int, seed: int, out: str) -> None:
    """One rank: its share of the first global batch, DDP's backward, rank 0 saves."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank),
                      WORLD_SIZE=str(WORLD))
    Ranks(rank, WORLD).start(cuda=False)  # joins as train.py's ranks do
    try:
        for name, backend in STRATEGIES:
            model, strategy, dataset = _setup(name, backend, seed)
            ddp = torch.nn.parallel.DistributedDataParallel(model)
            share = list(RankShare(len(dataset), PER_RANK, rank, WORLD))[:PER_RANK]
            images, targets = strategy.collate([dataset[i] for i in share])
            across = GlobalBatch(name, Ranks(rank, WORLD))  # DDP averages: scale WORLD
            across.count(targets, "cpu")
            loss = strategy.loss(ddp(images), targets)
            scaled = across.loss(loss)
            global_loss = across.shown(loss)
            scaled.backward()
            if rank == 0:
                torch.save({"loss": global_loss.detach(),
                            "grads": [p.grad.clone() for p in model.parameters()]},
                           os.path.join(out, f"{name}.pt"))
    finally:
        stop()  # every rank done, then the group freed before the interpreter ends


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_give_the_one_process_loss_and_gradients(tmp_path):
    seed = torch.randint(0, 2**31, ()).item()
    mp.spawn(_rank, args=(_free_port(), seed, str(tmp_path)), nprocs=WORLD, join=True)
    for name, backend in STRATEGIES:
        model, strategy, dataset = _setup(name, backend, seed)
        images, targets = strategy.collate([dataset[i] for i in range(PER_RANK * WORLD)])
        loss = strategy.loss(model(images), targets)
        loss.backward()
        ranks = torch.load(tmp_path / f"{name}.pt")
        torch.testing.assert_close(ranks["loss"], loss.detach(), rtol=1e-6, atol=1e-7,
                                   msg=f"{name} seed {seed}")
        for p, g in zip(model.parameters(), ranks["grads"], strict=True):
            torch.testing.assert_close(g, p.grad, rtol=1e-5, atol=1e-7,
                                       msg=f"{name} seed {seed}")


def test_each_rank_reads_its_share_of_every_global_batch_in_order():
    shares = [list(RankShare(14, 3, r, 2)) for r in range(2)]
    # Global batches of 6: samples 0-5 and 6-11; 12-13 are an incomplete one, dropped.
    assert shares == [[0, 1, 2, 6, 7, 8], [3, 4, 5, 9, 10, 11]]
    assert [len(RankShare(14, 3, r, 2)) for r in range(2)] == [6, 6]
    with pytest.raises(ValueError, match="rank 2 is outside a world of 2"):
        RankShare(14, 3, 2, 2)


def test_a_rank_without_boxes_adds_nothing_but_its_count():
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        pred = torch.rand(2, 4, 4, requires_grad=True)
        loss = pred.sum() * 0  # a strategy's loss with no valid box: 0 / max(0, 1)
        # A rank of two in form (so GlobalBatch communicates), in a group of one here.
        across = GlobalBatch("padded", Ranks(0, 2))
        across.count((torch.zeros(2, 4, 4), torch.zeros(2, dtype=torch.int32)), "cpu")
        scaled, global_loss = across.loss(loss), across.shown(loss)
        scaled.backward()
        assert global_loss.item() == 0 and (pred.grad == 0).all()
        assert local_boxes("concat", [torch.zeros(0, 4), torch.zeros(3, 4)], "cpu").item() == 3
        counts = torch.tensor([2, 0, 5], dtype=torch.int32)
        assert local_boxes("padded", (torch.zeros(3, 8, 4), counts), "cpu").item() == 7
        from data.collate import packed_targets
        packed = packed_targets([torch.zeros(2, 4), torch.zeros(0, 4), torch.zeros(5, 4)])
        assert local_boxes("packed", packed, "cpu").item() == 7
        assert local_boxes("nested", packed, "cpu").item() == 7
    finally:
        dist.destroy_process_group()


def test_ddp_wrapped_here_samples_no_runtime_stats():
    """Each runtime sample of DDP's logger syncs the host with a GPU (CUDA events read
    back): training/ddp.py takes the sampling out. On gloo the sampling is a CPU timer,
    so the samples' presence in the logging data shows whether it ran."""
    from training.ddp import without_runtime_stats
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_free_port()))
    dist.init_process_group("gloo", rank=0, world_size=1)
    try:
        sampled = {}
        for quiet in (False, True):
            ddp = torch.nn.parallel.DistributedDataParallel(torch.nn.Linear(4, 4))
            if quiet:
                without_runtime_stats(ddp)
            for _ in range(3):  # a sample is taken at the forward after a backward
                ddp(torch.rand(2, 4)).sum().backward()
            data = ddp._get_ddp_logging_data()  # the logger's other calls still answer
            assert data["module_name"] == "Linear"
            if quiet:  # a copy (made without __init__) answers too, without recursion
                copied = copy.copy(ddp.logger)._get_ddp_logging_data()
                assert copied.strs_map["module_name"] == "Linear"
            sampled[quiet] = "avg_forward_compute_time" in data
        assert sampled == {False: True, True: False}
    finally:
        dist.destroy_process_group()
