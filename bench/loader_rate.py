"""How fast the data loader delivers batches alone, and where its time goes: per batch, the
samples, the collate and the pinning; then make_loader as train.py builds it, batches per
second in steady state for each number of workers. Host wall time.

    python3 bench/loader_rate.py                      # the GPU preset: batch 1024, padded
    python3 bench/loader_rate.py --workers 8,16,32 --batches 300 --no-pin

The design in full: docs/design.md, this module's section."""

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import losses  # noqa: E402
from core.tables import markdown  # noqa: E402
from data import SyntheticFaces  # noqa: E402
from data.loader import make_loader  # noqa: E402


def median_ms(fn, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e3


def one_process(dataset, batch: int, collate, pin: bool, repeats: int) -> list:
    samples = [dataset[i] for i in range(batch)]
    rows = [["generate", median_ms(lambda: [dataset[i] for i in range(batch)], repeats)],
            ["collate", median_ms(lambda: collate(samples), repeats)]]
    if pin:
        images, targets = collate(samples)
        rows.append(["pin (images and targets)", median_ms(
            lambda: (images.pin_memory(), [t.pin_memory() for t in targets]), repeats)])
    return rows


def steady_rate(dataset, batch: int, workers: int, collate, pin: bool, batches: int,
                ring: bool):
    """(batches per second after the prefetch queue was used up, seconds to the first
    batch)."""
    loader = make_loader(dataset, batch, workers, collate, pin_memory=pin, ring=ring)
    it = iter(loader)
    t0 = time.perf_counter()
    next(it)
    first = time.perf_counter() - t0
    for _ in range(max(workers * 2, 1)):  # the queue the workers filled meanwhile
        next(it)
    t0 = time.perf_counter()
    for _ in range(batches):
        next(it)
    rate = batches / (time.perf_counter() - t0)
    del it, loader
    return rate, first


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=1024)
    parser.add_argument("--image-size", type=int, default=256)
    parser.add_argument("--workers", default="8,16,32")
    parser.add_argument("--batches", type=int, default=200,
                        help="batches timed per loader, after its prefetch queue")
    parser.add_argument("--loss", default="padded", help="whose collate")
    parser.add_argument("--no-pin", action="store_true", help="leave pinning out")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--loaders", default="torch",
                        help="comma-separated: torch (PyTorch's DataLoader), ring "
                        "(data/ring_loader.py)")
    args = parser.parse_args()
    pin = not args.no_pin and torch.cuda.is_available()
    collate = losses.get(args.loss).collate
    dataset = SyntheticFaces(1_000_000, args.image_size, seed=0)
    print(f"batch {args.batch}, {args.image_size}x{args.image_size} images, {args.loss}'s "
          f"collate, pinned: {pin}; host wall time")
    print(markdown(["one process, per batch", "ms"],
                   one_process(dataset, args.batch, collate, pin, args.repeats),
                   left={"one process, per batch"}))
    rows = []
    for kind in args.loaders.split(","):
        for workers in (int(w) for w in args.workers.split(",")):
            rate, first = steady_rate(dataset, args.batch, workers, collate, pin, args.batches,
                                      ring=kind == "ring")
            rows.append([kind, workers, f"{rate:.1f}", f"{rate * args.batch / 1e3:.1f}",
                         f"{first:.1f}"])
            print(f"{kind}, {workers} workers: {rate:.1f} batches/s", flush=True)
    print(markdown(["loader", "workers", "batches/s", "k samples/s", "s to the first batch"],
                   rows, left={"loader"}))


if __name__ == "__main__":
    main()
