"""Probe: the host's ms to issue one train step, per --parallel design on a process group of
one (NCCL, this GPU), beside the GPU's ms for the same step: the step alone (no loader, no
profiler), the GPU at most two steps behind; `--profile N` adds cProfile's N largest
functions by their own time.

    python3 bench/step_host.py [--designs one,ddp,tp] [--loss kernel --backend cuda]

The design in full: docs/design.md, this module's section."""

import argparse
import cProfile
import io
import os
import pstats
import statistics
import sys
import time

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
import bench.sharded_rank as sharded  # noqa: E402
from bench.needs_gpu import require_cuda  # noqa: E402

ROUNDS = 30  # rounds of three steps; the last two of each are timed


def host_ms(step, batch) -> list[float]:
    """Host ms of each timed step: three steps after a sync, the first not timed (it
    includes the sync's wake-up)."""
    for _ in range(10):  # compile, tune, fill the caches
        step(*batch)
    out = []
    for _ in range(ROUNDS):
        torch.cuda.synchronize()  # host-device sync: the GPU idle before each round
        marks = [time.perf_counter()]
        for _ in range(3):
            step(*batch)
            marks.append(time.perf_counter())
        out += [(marks[i + 1] - marks[i]) * 1e3 for i in (1, 2)]
    torch.cuda.synchronize()  # host-device sync: the rounds are done
    return out


def profiled(step, batch, top: int) -> str:
    """cProfile's `top` functions by own time over 20 steps, a sync after each."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(20):
        step(*batch)
        torch.cuda.synchronize()  # host-device sync: each step alone in the profile
    prof.disable()
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("tottime").print_stats(top)
    return text.getvalue()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--designs", default="one,ddp,tp")
    ap.add_argument("--loss", default="kernel")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--profile", type=int, default=0, metavar="N")
    args = ap.parse_args()
    require_cuda("it times each design's step on the device")
    mesh = sharded.world_of_one("29518")
    print(f"# The host's ms a step per design on a world of one, "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{args.loss}/{args.backend}\n\n| design | host ms median | p10 | p90 | GPU ms median |"
          "\n|---|---:|---:|---:|---:|", flush=True)
    for design in args.designs.split(","):
        step, batch, _ = sharded.built_step(design, args, mesh)
        host = sorted(host_ms(step, batch))
        gpu = statistics.median(sharded.time_steps(step, batch, 2, 10))
        print(f"| {design} | {statistics.median(host):.2f} | {host[len(host) // 10]:.2f} | "
              f"{host[len(host) * 9 // 10]:.2f} | {gpu:.2f} |", flush=True)
        if args.profile:
            print(f"\n### {design}: cProfile\n```\n{profiled(step, batch, args.profile)}```\n",
                  flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
