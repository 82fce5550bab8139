"""Why is the host slow for a while after a 44 ms wait? (bench/loss_cold.py found every
call, even a Python loop with no CUDA in it, 2-4x slower after a wait, a sleep or a cache
flush, with the profiler on or off.) Probes after waits of different kinds, with the
thread free to move among the process's cores or pinned to one.

    python3 bench/host_wake.py [--sched auto|spin|yield|blocking]   # GPU only

Waits: none (back-to-back), spin (a Python loop reading the clock for 44 ms: the thread
never leaves the CPU), sleep (time.sleep: it does), gpu (a 44 ms GPU kernel and a device
sync, as the forward's). Probes: a fixed Python loop (no CUDA), a device sync with nothing
pending, and the kernel/cuda loss plus a sync.
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
    cycles = gpu_cycles_for(WAIT_S)

    def spin():
        end = time.perf_counter() + WAIT_S
        while time.perf_counter() < end:
            pass

    def gpu():
        torch.cuda._sleep(cycles)
        torch.cuda.synchronize()  # host-device sync: the forward's own

    waits = {"none": lambda: None, "spin": spin, "sleep": lambda: time.sleep(WAIT_S),
             "gpu": gpu}
    probes = {"cpu probe": cpu_probe, "sync alone": torch.cuda.synchronize,
              "kernel/cuda + sync": lambda: (loss(pred, (case.boxes, case.counts)),
                                             torch.cuda.synchronize())}
    all_cores = os.sched_getaffinity(0)
    placements = {"free": all_cores, "pinned": {min(all_cores)}}
    for probe in probes.values():
        probe()
    results = {}
    for pname, cores in placements.items():
        os.sched_setaffinity(0, cores)
        for wname, wait in waits.items():
            for name, probe in probes.items():
                samples = []
                for _ in range(N):
                    wait()
                    t0 = time.perf_counter()
                    probe()
                    samples.append(time.perf_counter() - t0)
                results[pname, wname, name] = statistics.median(samples) * 1e3
    os.sched_setaffinity(0, all_cores)
    print(f"probe after a wait, median of {N}, ms; CUDA sync policy {args.sched}; "
          f"{len(all_cores)} cores; {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print("| thread | wait | " + " | ".join(probes) + " |")
    print("|---|---|" + "---:|" * len(probes))
    for pname in placements:
        for wname in waits:
            print(f"| {pname} | {wname} | " +
                  " | ".join(f"{results[pname, wname, n]:.3f}" for n in probes) + " |")


if __name__ == "__main__":
    main()
