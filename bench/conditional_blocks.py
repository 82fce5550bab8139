"""Probe: the Triton kernels' shapes (kernels/triton_giou.py SHAPES: slots per program,
slots per loop step, slots per step of conditional's zero stores, warps, pipeline stages)
for each variant, over box capacity and boxes per image at batch 1024: the loss alone,
forward + backward, on make sweep's inputs; GPU µs per call from the profiler's kernel
events (bench/loss_kernels.per_call), total and (forward, backward). The CUDA kernels'
shapes are compile-time constants in giou.cu (Shape<>; conditional's copies the Triton
one), not probed here.
Run on the device: python3 bench/conditional_blocks.py"""

import math
import sys

import torch

sys.path.insert(0, ".")
import kernels.triton_giou as tg  # noqa: E402
import losses  # noqa: E402
from bench.loss_kernels import per_call  # noqa: E402
from profiling.sweep_point import loss_call, predictions, samples  # noqa: E402

POINTS = [(1024, 256, 3.0), (1024, 1024, 3.0), (1024, 4096, 3.0), (1024, 1024, math.inf),
          (1024, 4096, math.inf)]
# (CHUNK, BLOCK, ZERO_BLOCK, num_warps, num_stages) per variant; the first is the default.
SHAPES = {
    "kernel": [(1024, 256, 256, 4, 1), (256, 256, 256, 4, 1), (256, 256, 256, 4, 3),
               (512, 512, 512, 4, 1), (1024, 1024, 1024, 8, 1)],
    "conditional": [(1024, 128, 512, 4, 1), (1024, 256, 512, 4, 1), (1024, 256, 512, 4, 3),
                    (2048, 256, 512, 4, 1), (512, 256, 512, 4, 1), (1024, 256, 1024, 4, 1),
                    (256, 256, 256, 4, 1)],
}
KEYS = ("CHUNK", "BLOCK", "ZERO_BLOCK", "num_warps", "num_stages")


def label(shape) -> str:
    chunk, block, zero, warps, stages = shape
    return f"{chunk}/{block}/{zero}/{warps}w/{stages}s"


def main():
    device = torch.device("cuda")
    defaults = {v: dict(tg.SHAPES[v]) for v in (False, True)}
    print("GPU us per call, total (forward, backward), profiler kernel events, median; "
          "shape = slots per program/per step/per zero step/warps/stages; defaults "
          f"kernel {defaults[False]}, conditional {defaults[True]}", flush=True)
    for batch, capacity, sigma in POINTS:
        pairs = samples(batch, capacity, sigma, 0)
        per_image = sum(b.shape[0] for _, b in pairs) / batch
        pred = predictions(batch, capacity, device, torch.bfloat16, 0)
        for variant, conditional in (("kernel", False), ("conditional", True)):
            strategy = losses.get(variant, "triton", capacity=capacity)
            targets = strategy.to_device(strategy.collate(pairs)[1], device)
            run = loss_call(strategy, pred, targets)
            line = []
            for shape in SHAPES[variant]:
                tg.SHAPES[conditional] = dict(zip(KEYS, shape))
                t = per_call(run)
                line.append(f"{label(shape)} {sum(t.values()):.1f} "
                            f"({t.get('_giou_fwd_kernel', 0):.1f}, "
                            f"{t.get('_giou_bwd_kernel', 0):.1f})")
            tg.SHAPES[conditional] = dict(defaults[conditional])
            print(f"B {batch} M {capacity} sigma {sigma:g} ({per_image:.3g} boxes/image) "
                  f"{variant}: " + "; ".join(line), flush=True)


if __name__ == "__main__":
    main()
