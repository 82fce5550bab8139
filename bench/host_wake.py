"""Why is the host slow for a while after a 44 ms wait? (bench/loss_cold.py found every
call, even a Python loop with no CUDA in it, 2-4x slower after a wait, a sleep or a cache
flush, with the profiler on or off.) Probes after waits of different kinds. (A first
version also pinned the thread to one core: no difference; RESULTS.md section 3.)

    python3 bench/host_wake.py [--sched auto|spin|yield|blocking]   # GPU only

Waits: none (back-to-back), spin (a Python loop reading the clock for 44 ms: the thread
never leaves the CPU, no CUDA call), sleep (time.sleep: it does), gpu sleep (a 44 ms
one-thread GPU kernel and a device sync), gpu matmuls (44 ms of bf16 matmuls and a sync:
the GPU as busy as in the forward). Probes, each after its own wait: a fixed Python loop
(no CUDA), a device sync with nothing pending, the kernel/cuda loss split into the call's
host time and the sync's, and the loss's GPU span between two events.
"""

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

N = 30
WAIT_S = 0.044


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sched", default="auto", choices=("auto", "spin", "yield", "blocking"))
    parser.add_argument("--sweep", action="store_true",
                        help="instead: spins of 0 to 44 ms, then the loss call or a touch of "
                             "256 pages (reads or writes) or of one page")
    args = parser.parse_args()
    from bench.host_variant import SCHED, set_sched
    if args.sched != "auto":
        set_sched(SCHED[args.sched])  # before torch creates the context
    import torch
    import losses
    from bench.loss_cold import cpu_probe, gpu_cycles_for
    from tests.cases import make_case

    case = make_case("mixed", 1024, 256, torch.bfloat16, seed=0).to("cuda")
    pred = case.pred.clone().requires_grad_(True)
    loss = losses.get("kernel", kernel="cuda").loss
    if args.sweep:
        return sweep(lambda: loss(pred, (case.boxes, case.counts)), torch)
    cycles = gpu_cycles_for(WAIT_S)

    def spin():
        end = time.perf_counter() + WAIT_S
        while time.perf_counter() < end:
            pass

    def gpu():
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()  # host-device sync: the forward's own

    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    matmuls = max(1, round(WAIT_S / time_matmul(a)))

    def gpu_busy():
        for _ in range(matmuls):
            a @ a
        torch.cuda.synchronize()  # host-device sync: the forward's own

    waits = {"none": lambda: None, "spin": spin, "sleep": lambda: time.sleep(WAIT_S),
             "gpu sleep": gpu, "gpu matmuls": gpu_busy}
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)

    def split_call():
        """(host ms of the loss call, host ms of the sync after it)"""
        t0 = time.perf_counter()
        loss(pred, (case.boxes, case.counts))
        t1 = time.perf_counter()
        torch.cuda.synchronize()  # host-device sync: closes the range
        return t1 - t0, time.perf_counter() - t1

    def gpu_span():
        """GPU ms from an event before the loss to one after it."""
        start.record()
        loss(pred, (case.boxes, case.counts))
        end.record()
        end.synchronize()  # host-device sync: closes the range
        return start.elapsed_time(end) / 1e3

    columns = ("cpu probe", "sync alone", "loss call", "sync after it", "loss GPU span")
    for _ in range(3):
        split_call(), gpu_span(), cpu_probe()
    results = {}
    for wname, wait in waits.items():
        samples = {c: [] for c in columns}
        for _ in range(N):
            wait()
            t0 = time.perf_counter()
            cpu_probe()
            samples["cpu probe"].append(time.perf_counter() - t0)
            wait()
            t0 = time.perf_counter()
            torch.cuda.synchronize()  # host-device sync: the probe
            samples["sync alone"].append(time.perf_counter() - t0)
            wait()
            call, sync = split_call()
            samples["loss call"].append(call)
            samples["sync after it"].append(sync)
            wait()
            samples["loss GPU span"].append(gpu_span())
        for c in columns:
            results[wname, c] = statistics.median(samples[c]) * 1e3
    print(f"probe after a wait, median of {N}, ms; CUDA sync policy {args.sched}; "
          f"{len(os.sched_getaffinity(0))} cores; {matmuls} bf16 8192^3 matmuls per GPU "
          f"wait; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| wait | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for wname in waits:
        print(f"| {wname} | " + " | ".join(f"{results[wname, c]:.3f}" for c in columns) + " |")


def sweep(loss_call, torch) -> None:
    """After how long a pause is the host slow, and is it the pages? The same 256 pages
    (4 KiB apart) or one page, read or written, after spins of growing length."""
    import numpy as np
    pages = np.zeros(256 * 4096, dtype=np.uint8)
    one = np.zeros(4096, dtype=np.uint8)
    probes = {
        "loss call": loss_call,
        "write 256 pages": lambda: pages[::4096].__iadd__(1),
        "read 256 pages": lambda: int(pages[::4096].sum()),
        "write 1 page": lambda: one[:256].__iadd__(1),
    }
    gaps_ms = (0, 0.1, 0.3, 1, 3, 10, 44)
    results = {}
    for gap in gaps_ms:
        for name, probe in probes.items():
            samples = []
            for _ in range(N):
                end = time.perf_counter() + gap / 1e3
                while time.perf_counter() < end:
                    pass
                t0 = time.perf_counter()
                probe()
                samples.append(time.perf_counter() - t0)
                torch.cuda.synchronize()  # host-device sync: outside the timed probe
            results[gap, name] = statistics.median(samples) * 1e6
    print(f"probe after a spin of the given length, median of {N}, us; "
          f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| spin ms | " + " | ".join(probes) + " |")
    print("|---:|" + "---:|" * len(probes))
    for gap in gaps_ms:
        print(f"| {gap} | " + " | ".join(f"{results[gap, n]:.1f}" for n in probes) + " |")


def time_matmul(a) -> float:
    """Seconds of one a @ a (for sizing the busy wait)."""
    import torch
    for _ in range(3):
        a @ a
    torch.cuda.synchronize()  # host-device sync: calibration only
    t0 = time.perf_counter()
    for _ in range(10):
        a @ a
    torch.cuda.synchronize()  # host-device sync: calibration only
    return (time.perf_counter() - t0) / 10


if __name__ == "__main__":
    main()
