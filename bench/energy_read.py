"""Probe: how long one read of NVML's energy counter (profiling/energy.py's meter) holds
the calling thread: alone, beside nvidia-smi's sampler as a run has it
(profiling/gpu_clocks.py), and beside a Python thread that keeps the interpreter busy
(ctypes lets the GIL go during the call, and the caller may wait up to CPython's switch
interval to get it back). Under cProfile a run's reads took 4.7 ms each (results/host.md);
this tells the driver's share from the GIL's.

    python3 bench/energy_read.py [--reads 300]
"""

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from bench.needs_gpu import require_cuda  # noqa: E402
from profiling import energy, gpu_clocks  # noqa: E402


def read_ms(meter, reads: int) -> list[float]:
    """Host ms of each of `reads` reads, 5 ms apart (about a step's share of them)."""
    out = []
    for _ in range(reads):
        started = time.perf_counter()
        meter()
        out.append((time.perf_counter() - started) * 1e3)
        time.sleep(0.005)
    return sorted(out)


def busy_thread():
    """A daemon thread running Python until the returned event is set."""
    stop = threading.Event()

    def spin():
        n = 0
        while not stop.is_set():
            n += 1
    threading.Thread(target=spin, daemon=True).start()
    return stop


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reads", type=int, default=300)
    args = ap.parse_args()
    require_cuda("the counter is the GPU's, read through its driver")
    gpu = gpu_clocks.gpu_id(0)
    meter, why = energy.open_meter(gpu)
    if meter is None:
        sys.exit(f"no energy counter here: {why}")
    print(f"# One read of NVML's energy counter, {gpu}, {args.reads} reads a row, host ms\n"
          "\n| beside | median | p90 | max |\n|---|---:|---:|---:|")

    def row(name, ms):
        print(f"| {name} | {statistics.median(ms):.3f} | {ms[len(ms) * 9 // 10]:.3f} | "
              f"{ms[-1]:.3f} |", flush=True)
    row("nothing", read_ms(meter, args.reads))
    with tempfile.TemporaryDirectory() as folder:
        sampler = gpu_clocks.Sampler.start(Path(folder) / "clocks.csv", gpu)
        try:
            row(f"nvidia-smi every {gpu_clocks.SAMPLE_MS} ms", read_ms(meter, args.reads))
        finally:
            sampler.stop()
    stop = busy_thread()
    try:
        row("a busy Python thread", read_ms(meter, args.reads))
    finally:
        stop.set()


if __name__ == "__main__":
    main()
