"""The host time of each layout's collate alone at make sweep's points: the targets' share
(the images are one pixel, as in the sweep), the fastest and the median of 11 calls with
the garbage collector paused. make sweep's own collate column is a median taken between
GPU measurements, where it varied by milliseconds between calls of the same collate
(results/sweep.md), so this script times the collates alone.

    python3 bench/collate_cost.py [--calls 11]      # prints a Markdown table
"""

import argparse
import math
import os
import statistics
import sys
from functools import partial

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from data.collate import collate_list, collate_packed, collate_padded  # noqa: E402
from studies.sweep_point import collate_times, samples  # noqa: E402

LAYOUTS = {"list (loop, concat)": collate_list, "padded (padded ... conditional)":
           collate_padded, "packed (packed, nested)": collate_packed}
POINTS = [(64, 256, 3.0), (1024, 256, 3.0), (8192, 256, 3.0), (1024, 1024, 3.0),
          (1024, 4096, 3.0), (1024, 1024, math.inf)]


def timed(collate, pairs, capacity: int, calls: int) -> tuple[float, float]:
    times = collate_times(partial(collate, capacity=capacity), pairs, calls)
    return min(times), statistics.median(times)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], allow_abbrev=False)
    parser.add_argument("--calls", type=int, default=11)
    args = parser.parse_args()
    print("| batch | M | sigma | " + " | ".join(f"{name} ms, fastest / median"
                                                for name in LAYOUTS) + " |")
    print("|---:|---:|---:|" + "---:|" * len(LAYOUTS))
    for batch, capacity, sigma in POINTS:
        pairs = samples(batch, capacity, sigma, seed=0)
        cells = []
        for collate in LAYOUTS.values():
            fastest, median = timed(collate, pairs, capacity, args.calls)
            cells.append(f"{fastest:.3g} / {median:.3g}")
        label = "full" if math.isinf(sigma) else f"{sigma:g}"
        print(f"| {batch} | {capacity} | {label} | " + " | ".join(cells) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
