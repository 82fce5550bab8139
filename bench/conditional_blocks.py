"""Probe: the Triton conditional kernel's block shape (slots per program, warps) against
the kernel variant, over box capacity and boxes per image at batch 1024: the loss alone,
forward + backward, measured by make sweep's own point (profiling/sweep_point.measure:
triton do_bench medians). Run on the device: python3 bench/conditional_blocks.py"""

import math
import sys

import torch

sys.path.insert(0, ".")
import kernels.triton_giou as tg  # noqa: E402
from profiling.sweep_point import measure, samples  # noqa: E402

POINTS = [(1024, 256, 3.0), (1024, 1024, 3.0), (1024, 4096, 3.0), (1024, 1024, 30.0),
          (1024, 1024, math.inf)]
SHAPES = [(32, 1), (64, 1), (128, 1), (128, 4), (256, 4), (512, 4), (1024, 4), (1024, 8)]


def main():
    device = torch.device("cuda")
    for batch, capacity, sigma in POINTS:
        pairs = samples(batch, capacity, sigma, 0)
        per_image = sum(b.shape[0] for _, b in pairs) / batch
        base = measure("kernel", "triton", batch, capacity, sigma, pairs, device,
                       torch.bfloat16, 0, 100)
        line = [f"B {batch} M {capacity} sigma {sigma:g} ({per_image:.3g} boxes/image): "
                f"kernel {base['GPU ms'] * 1e3:.1f} us (GPU ms per call, from the profiler)"]
        for slots, warps in SHAPES:
            tg.BLOCK_SLOTS[True], tg.NUM_WARPS[True] = slots, warps
            r = measure("conditional", "triton", batch, capacity, sigma, pairs, device,
                        torch.bfloat16, 0, 100)
            line.append(f"{slots}/{warps}w {r['GPU ms'] * 1e3:.1f}")
        print("; ".join(line), flush=True)


if __name__ == "__main__":
    main()
