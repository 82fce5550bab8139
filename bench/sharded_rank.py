"""Probe: what one rank of each --parallel design computes, on one GPU, so that the
several-GPU prediction (docs/several-gpus.md's cost model) rests on measured compute and
only the collectives are taken from elsewhere: a rank's whole step per design on a group
of one, the pieces that change with N at full size, the step with lin1's update inline,
and rank 0 of a fake world of N (--fake-worlds 2,4).

    python3 bench/sharded_rank.py [--loss kernel --backend cuda]
        [--designs one,one-inline,ddp,zero,tp,tp-inline] [--worlds 1,2,4,8] --json out.json

The design in full: docs/design.md, this module's section."""

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, ".")
import train  # noqa: E402
from bench.needs_gpu import require_cuda  # noqa: E402
from data import SyntheticFaces  # noqa: E402
from profiling.environment import environment  # noqa: E402
from training import parallel, speedups  # noqa: E402
from training.ranks import Ranks  # noqa: E402


def one_batch(cfg, strategy, device):
    dataset = SyntheticFaces(cfg.dataset_length, cfg.image_size, cfg.seed)
    images, targets = strategy.collate([dataset[i] for i in range(cfg.batch_size)])
    return images.to(device), strategy.to_device(targets, device)


def wrap_for(design: str, mesh):
    """The model as rank 0 of `design` runs it, on the mesh's world (one, or a fake one)."""
    world = mesh.size()

    def wrap(model):
        if design == "one":
            return model
        # ddp keeps every row on every rank: a world of one to apply, whatever the world.
        owned = parallel.apply(model, design, mesh,
                               Ranks(world=1 if design == "ddp" else world))
        from torch.nn.parallel import DistributedDataParallel as DDP

        from training.ddp import allreduce_sum_hook, no_buffer_broadcast
        if owned:
            DDP._set_params_and_buffers_to_ignore_for_model(model, owned)
        ddp = DDP(model, device_ids=[0], gradient_as_bucket_view=True, **no_buffer_broadcast())
        ddp.register_comm_hook(None, allreduce_sum_hook if world == 1 else _fake_sum_hook)
        return ddp
    return wrap


def _fake_sum_hook(process_group, bucket):
    """allreduce_sum_hook's call on a fake world, whose futures hold no value: the bucket
    as it is (the all-reduce moved nothing)."""
    work = dist.all_reduce(bucket.buffer(), group=process_group, async_op=True)
    return work.get_future().then(lambda _: bucket.buffer())


def time_steps(step, batch, warmup: int, steps: int) -> list[float]:
    ms = []
    for i in range(warmup + steps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        step(*batch)
        end.record()
        if i >= warmup:
            ms.append((start, end))
    torch.cuda.synchronize()  # host-device sync: once, after the timed steps
    return [s.elapsed_time(e) for s, e in ms]


def built_step(name, args, mesh):
    """(the train step, one batch, the moment its build began) of design `name` as a rank
    runs it, train.py's step (train.make_step); `name` is a design, and '-inline' after it
    puts lin1's update not beside the trunk, '-graphed' tp's head in CUDA graphs (which a
    world of one would otherwise refuse: its design reads as one GPU's)."""
    import losses
    design, *suffixes = name.split("-")
    inline, graphed = "inline" in suffixes, "graphed" in suffixes
    cfg = train.parse_config(["--loss", args.loss, "--backend", args.backend] +
                             (["--lin1-update-beside-trunk", "off"] if inline else []) +
                             (["--parallel", design] if mesh.size() > 1 else []))
    device = torch.device("cuda", 0)
    used = {**speedups.resolve(train.asked_of(cfg), True)["on"], "graphed_head": graphed,
            # A fake group maps no peer's memory: tp's collectives stay its own, which move
            # nothing, and the carveout stays as resolved (idle where the copies would run).
            "copy_engine_collectives": False}
    speedups.set_process_flags(used, True, many_runs=True)
    strategy = losses.get(cfg.loss, backend=cfg.backend, capacity=cfg.max_boxes)
    torch._dynamo.reset()  # the last design's compiled graphs held its model
    import gc
    gc.collect()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    started = time.perf_counter()
    model, runner, optimizer = speedups.build(used, device, False, train.model_sizes(cfg),
                                              cfg.amp, cfg.lr, wrap_for(design, mesh))
    prefetch = (lambda: model.lin1.unshard(async_op=True)) if design == "zero" else None
    fns = train.make_step(cfg, strategy, runner, optimizer, device, prefetch=prefetch)
    return fns.train_step, one_batch(cfg, strategy, device), started


def design_step(name, args, mesh) -> dict:
    """`name`'s step timed on the GPU: the row of table A."""
    step, batch, started = built_step(name, args, mesh)
    ms = time_steps(step, batch, args.warmup, args.steps)
    if args.top:
        print(top_kernels(name.split("-")[0], step, batch, args.top), flush=True)
    row = {"design": name, "world": mesh.size(), "step ms median": statistics.median(ms),
           "step ms min": min(ms), "step ms max": max(ms),
           "peak GB": torch.cuda.max_memory_allocated() / 1e9,
           "build+run s": time.perf_counter() - started}
    return row  # the model goes with this frame; the next design resets dynamo first


def top_kernels(design: str, step, batch, top: int) -> str:
    """The GPU work of 3 profiled steps, by kernel name, ms per step: where a design's
    step time goes beside the one-GPU step's."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(3):
            step(*batch)
        torch.cuda.synchronize()  # host-device sync: the profiled steps are done
    rows = sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:top]
    lines = [f"{design}: {e.device_time_total / 3e3:7.3f} ms/step  {e.count // 3:3d}x  "
             f"{e.key[:90]}" for e in rows]
    return "\n".join([f"### {design}: top GPU work per step", *lines, ""])


def cuda_ms(fn, reps: int = 20) -> float:
    for _ in range(3):
        fn()
    pairs = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()  # host-device sync: once, after the timed calls
    return statistics.median(s.elapsed_time(e) for s, e in pairs)


def gemms(world: int, batch: int, features: int, hidden: int, out: int) -> tuple:
    """(lin1's, lin2's) {fwd, dX, dW} ms at a tp rank's shapes."""
    bf = dict(device="cuda", dtype=torch.bfloat16)
    rows, gb = hidden // world, batch * world
    x, w1 = torch.randn(gb, features, **bf), torch.randn(rows, features, **bf) * 0.01
    y = x @ w1.t()
    w2, dout = torch.randn(out, rows, **bf), torch.randn(gb, out, **bf)
    lin1 = {"fwd": cuda_ms(lambda: x @ w1.t()), "dX": cuda_ms(lambda: y @ w1),
            "dW": cuda_ms(lambda: y.t() @ x)}
    lin2 = {"fwd": cuda_ms(lambda: y @ w2.t()), "dX": cuda_ms(lambda: dout @ w2),
            "dW": cuda_ms(lambda: dout.t() @ y)}
    return lin1, lin2


def shadow_sgd_ms(rows: int, features: int) -> float:
    from kernels.lin1.shadow_sgd import shadow_sgd_step
    master = torch.randn(rows, features, device="cuda")
    buf, grad = torch.zeros_like(master), torch.randn_like(master).bfloat16()
    weight = master.bfloat16()
    return cuda_ms(lambda: shadow_sgd_step(master, grad, buf, weight, 1e-4, 0.9, False))


def rank_pieces(world: int, batch=1024, features=65536, hidden=16384, out=1024) -> dict:
    """A tp rank's GEMMs (global batch N*B, H/N rows) and a zero/tp rank's shadow SGD."""
    lin1, lin2 = gemms(world, batch, features, hidden, out)
    rows = hidden // world
    sgd = shadow_sgd_ms(rows, features)
    flops = 2 * batch * world * features * rows * 3
    return {"world": world, "lin1 GEMMs ms": sum(lin1.values()),
            **{f"lin1 {k}": v for k, v in lin1.items()},
            "lin1 TFLOP/s": flops / sum(lin1.values()) / 1e9,
            "lin2 GEMMs ms": sum(lin2.values()), "shadow SGD ms (H/N rows)": sgd,
            "shadow SGD TB/s": rows * features * 20 / sgd / 1e9}


def table(rows: list[dict]) -> str:
    keys = list(rows[0])
    fmt = (lambda v: f"{v:.2f}" if isinstance(v, float) else str(v))
    return "\n".join(["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)] +
                     ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows])


def world_of_one(port: str):
    """An NCCL process group of this process alone on GPU 0, and its 1-D mesh: a design's
    collectives run and move nothing."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", port)
    torch.cuda.set_device(0)
    dist.init_process_group("nccl", rank=0, world_size=1)
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cuda", (1,), mesh_dim_names=("shard",))


def fake_world(n: int):
    """Rank 0 of a fake process group of n ranks on GPU 0, and its 1-D mesh; the
    environment says rank 0 of n, so that the speed-ups resolve as on n ranks."""
    from torch.testing._internal.distributed.fake_pg import FakeStore
    os.environ.update(RANK="0", WORLD_SIZE=str(n), LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(n))
    torch.cuda.set_device(0)
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=n)
    from torch.distributed.device_mesh import init_device_mesh
    return init_device_mesh("cuda", (n,), mesh_dim_names=("shard",))


def fake_world_rows(worlds: str, designs: str, args) -> list[dict]:
    """Table D: each fake world in a process of its own (a process joins one group)."""
    import subprocess
    import tempfile
    rows = []
    for n in filter(None, worlds.split(",")):
        with tempfile.NamedTemporaryFile(suffix=".json") as out:
            subprocess.run([sys.executable, __file__, "--fake-world", n, "--designs", designs,
                            "--worlds", "", "--loss", args.loss, "--backend", args.backend,
                            "--warmup", str(args.warmup), "--steps", str(args.steps),
                            "--json", out.name], check=True)
            rows += json.loads(Path(out.name).read_text())["steps"]
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loss", default="kernel")
    ap.add_argument("--backend", default="cuda")  # the strategy the several-GPU runs time
    ap.add_argument("--designs", default="one,one-inline,ddp,zero,tp,tp-inline")
    ap.add_argument("--worlds", default="1,2,4,8")
    ap.add_argument("--warmup", type=int, default=8)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--top", type=int, default=0, help="print each design's N largest "
                    "kernels per step (a profile of 3 steps)")
    ap.add_argument("--fake-worlds", default="2,4",
                    help="table D's worlds (default %(default)s; none: '')")
    ap.add_argument("--fake-designs", default="tp-graphed,ddp,zero",
                    help="table D's designs (default %(default)s)")
    ap.add_argument("--fake-world", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--json", default=os.environ.get("SHARDED_JSON", ""))
    args = ap.parse_args()
    require_cuda("it times a rank's work per design on the device")
    mesh = world_of_one("29517") if args.fake_world == 1 else fake_world(args.fake_world)
    print(f"# A rank's work per design, {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}, {args.loss}/{args.backend}\n", flush=True)
    steps = []
    for design in filter(None, args.designs.split(",")):
        try:
            steps.append(design_step(design, args, mesh))
        except Exception as exc:  # a design that fails here is a finding, not the end
            steps.append({"design": design, "world": mesh.size(),
                          "step ms median": float("nan"), "step ms min":
                          float("nan"), "step ms max": float("nan"), "peak GB": float("nan"),
                          "build+run s": 0.0})
            print(f"{design}: failed: {type(exc).__name__}: {str(exc)[:400]}", flush=True)
        print(table(steps[-1:]), flush=True)
    if steps:
        print(f"\n## {'A' if args.fake_world == 1 else 'D'}. The step on a world of "
              f"{args.fake_world}\n\n" + table(steps), flush=True)
    pieces = [rank_pieces(int(n)) for n in args.worlds.split(",") if n]
    if pieces:
        print("\n## B. A rank's lin1, lin2 and shadow SGD at N ranks (tp shapes)\n\n" +
              table(pieces), flush=True)
    if args.fake_world == 1 and args.fake_worlds:
        dist.destroy_process_group()  # before the fake worlds' processes take the GPU
        steps += fake_world_rows(args.fake_worlds, args.fake_designs, args)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"steps": steps, "pieces": pieces, "device": torch.cuda.get_device_name(),
                       "torch": torch.__version__, "loss": f"{args.loss}/{args.backend}",
                       "commit": environment()["commit"]}, f, indent=1)
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
