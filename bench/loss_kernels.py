"""Probe: where a fused loss call's GPU time goes, kernel by kernel: `kernel` against
`conditional`, both backends, at make sweep's points (the loss alone, forward + backward,
bf16 predictions, the dataset's targets), next to the floor of the backward's dense write
(a memset of the gradient's bytes, and a fill kernel). Durations are the profiler's
kernel events, median over calls. Run on the device: python3 bench/loss_kernels.py
[--points M:SIGMA,...] [--batch B]"""

import argparse
import re
import statistics
import sys
from collections import defaultdict

import torch
from torch.profiler import ProfilerActivity, profile, record_function

sys.path.insert(0, ".")
import losses  # noqa: E402
from profiling.sweep_point import loss_call, predictions, samples  # noqa: E402
from profiling.trace_events import GPU_CATS, profiler_events  # noqa: E402

STRATEGIES = [("kernel", "triton"), ("conditional", "triton"), ("kernel", "cuda"),
              ("conditional", "cuda")]
CALLS = 30


def short(name: str) -> str:
    if "FillFunctor" in name:
        return "fill"
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(anonymous namespace\)::", "", name)
    return re.split(r"[<(]", name)[0]


def per_call(run, calls: int = CALLS) -> dict[str, float]:
    """Median µs per call of each GPU activity name over `calls` profiled calls."""
    run()
    torch.cuda.synchronize()  # host-device sync: warm-up done before the profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for i in range(calls):
            with record_function(f"call{i}"):
                run()
        torch.cuda.synchronize()  # host-device sync: every activity in the trace
    by_name = defaultdict(list)
    for e in profiler_events(prof):
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            by_name[short(e["name"])].append(float(e.get("dur", 0)))
    return {k: statistics.median(v) * len(v) / calls for k, v in by_name.items()}


def line(label: str, times: dict[str, float]) -> str:
    parts = ", ".join(f"{k} {v:.1f}" for k, v in sorted(times.items(), key=lambda kv: -kv[1]))
    return f"  {label:<20} {sum(times.values()):7.1f} us  ({parts})"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--points", default="256:3,1024:3,4096:3,1024:30,1024:inf")
    args = parser.parse_args()
    device = torch.device("cuda")
    print(f"{torch.cuda.get_device_name()} torch {torch.__version__}; GPU us per call "
          f"(median of {CALLS} profiled calls), batch {args.batch}", flush=True)
    for point in args.points.split(","):
        capacity, sigma = int(point.split(":")[0]), float(point.split(":")[1])
        pairs = samples(args.batch, capacity, sigma, 0)
        per_image = sum(b.shape[0] for _, b in pairs) / args.batch
        print(f"M {capacity}, sigma {sigma:g} ({per_image:.3g} boxes per image)")
        pred = predictions(args.batch, capacity, device, torch.bfloat16, 0)
        grad_bytes = pred.numel() * pred.element_size()
        zeros = lambda: torch.zeros(pred.shape, dtype=pred.dtype, device=device)  # noqa: E731
        fill = torch.empty_like(pred)
        print(line("memset (grad bytes)", per_call(zeros)) + f"  {grad_bytes / 1e6:.1f} MB")
        print(line("fill_ (grad bytes)", per_call(lambda: fill.fill_(0))))
        for loss, backend in STRATEGIES:
            strategy = losses.get(loss, backend, capacity=capacity)
            targets = strategy.to_device(strategy.collate(pairs)[1], device)
            run = loss_call(strategy, pred, targets)
            print(line(f"{loss}/{backend}", per_call(run)), flush=True)


if __name__ == "__main__":
    main()
