"""Is the loss range slow in a training step because the host is cold? The same loss call
plus a device sync, timed with a host clock with and without the profiler,
right after one of several things a training step does before its loss.

    python3 bench/loss_cold.py            # GPU only; prints a table (ms, median of N)

Conditions (what happens just before each timed call):
  warm      nothing: back-to-back calls, as bench/loss_overhead.py
  gpu-wait  a 44 ms GPU kernel and a sync (the forward's wait, without its host work)
  sleep     time.sleep(44 ms): the thread leaves the CPU, as in a blocking sync
  flush     the host writes a 1 GB buffer, over three times the H100 machine's 300 MiB L3
            (the data pipeline's 64 MB images, the pinned copy and the collate pass far
            more than a last-level cache through the host)
  both      gpu-wait, then flush
Calls: the kernel/cuda and kernel/triton strategies, the CUDA op alone (no Python input
checks), the sync alone (the floor of each condition), and a CPU probe (a fixed loop of
Python arithmetic, no CUDA: is the CPU itself slow after the condition?).
Profiler: off, CPU activity only (no CUPTI), or CPU+CUDA with profile_memory (train.py's).
"""

import contextlib
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

import losses  # noqa: E402
from tests.cases import make_case  # noqa: E402

N = 30
WAIT_S = 0.044  # the forward's sync in a forward-mode step at the full preset


def gpu_cycles_for(seconds: float) -> int:
    """How many cycles torch.cuda._sleep needs to keep the GPU busy for `seconds`."""
    probe = 10_000_000
    torch.cuda._sleep(probe)  # warm
    torch.cuda.synchronize()  # host-device sync: calibration only
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(probe)
    end.record()
    end.synchronize()  # host-device sync: calibration only
    return int(probe * seconds * 1e3 / start.elapsed_time(end))


def cpu_probe() -> int:
    total = 0
    for i in range(2000):
        total += i * i % 7
    return total


def profiler(mode: str):
    acts = [torch.profiler.ProfilerActivity.CPU]
    if mode == "off":
        return contextlib.nullcontext()
    if mode == "cpu":
        return torch.profiler.profile(activities=acts)
    acts.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(activities=acts, profile_memory=True)


def main() -> None:
    case = make_case("mixed", 1024, 256, torch.bfloat16, seed=0).to("cuda")
    boxes, counts = case.boxes, case.counts
    pred = case.pred.clone().requires_grad_(True)
    cycles = gpu_cycles_for(WAIT_S)
    buf = np.zeros(1 << 30, dtype=np.uint8)

    def gpu_wait():
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()  # host-device sync: the forward's own

    def flush():
        np.add(buf, 1, out=buf)

    conditions = {
        "warm": lambda: None,
        "gpu-wait": gpu_wait,
        "sleep": lambda: time.sleep(WAIT_S),
        "flush": flush,
        "both": lambda: (gpu_wait(), flush()),
    }
    cuda_loss = losses.get("kernel", kernel="cuda").loss
    triton_loss = losses.get("kernel", kernel="triton").loss
    op = torch.ops.giou_cuda.loss.default  # loaded by the kernel/cuda strategy above
    calls = {
        "kernel/cuda": lambda: cuda_loss(pred, (boxes, counts)),
        "kernel/triton": lambda: triton_loss(pred, (boxes, counts)),
        "cuda op alone": lambda: op(pred, boxes, counts, False),
        "sync alone": lambda: None,
        "cpu probe": cpu_probe,
    }
    for call in calls.values():
        for _ in range(10):
            call()
    torch.cuda.synchronize()  # host-device sync: after the warm-up

    results = {}
    modes = ("off", "cpu", "cpu+cuda")
    for mode in modes:
        with profiler(mode):
            for cname, before in conditions.items():
                for name, call in calls.items():
                    samples = []
                    for _ in range(N):
                        before()
                        t0 = time.perf_counter()
                        with torch.profiler.record_function("loss"):
                            call()
                            torch.cuda.synchronize()  # host-device sync: closes the range
                        samples.append(time.perf_counter() - t0)
                    results[mode, cname, name] = statistics.median(samples) * 1e3
    print(f"loss range (call + sync), median of {N}, ms; batch 1024, bf16 predictions "
          f"requiring grad; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| profiler | before each call | " + " | ".join(calls) + " |")
    print("|---|---|" + "---:|" * len(calls))
    for mode in modes:
        for cname in conditions:
            print(f"| {mode} | {cname} | " +
                  " | ".join(f"{results[mode, cname, n]:.3f}" for n in calls) + " |")


if __name__ == "__main__":
    main()
