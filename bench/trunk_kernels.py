"""The conv trunk's GPU work kernel by kernel, as the train step runs it.

bench/roofline.py times the trunk's forward and backward as one phase; this says which
kernels that time is made of: the trunk compiled as the step compiles it (its flatten
included), forward and backward, 3 profiled calls, each kernel's GPU ms per call; then
the same for the whole train step, so the trunk's share of it can be read off.

Run on the device: python3 bench/trunk_kernels.py [--loss padded] [--top 40]
"""

import argparse
import sys

import torch

sys.path.insert(0, ".")
from bench.needs_gpu import require_cuda  # noqa: E402
from bench.roofline import preset_step, trunk_call  # noqa: E402
from bench.sharded_rank import cuda_ms, top_kernels  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loss", default="padded")
    ap.add_argument("--top", type=int, default=40)
    ap.add_argument("train_args", nargs="*", help="more train.py options, after --")
    args = ap.parse_args()
    require_cuda("it times the trunk's kernels and the step on the device")
    cfg, model, fns, batch = preset_step(["--loss", args.loss, *args.train_args])
    fwd_bwd = trunk_call(model, batch[0])
    print(f"# The trunk's kernels, {torch.cuda.get_device_name()}, torch {torch.__version__}, "
          f"{cfg.loss}, batch {cfg.batch_size}\n")
    print(f"trunk forward + backward, compiled: {cuda_ms(fwd_bwd, reps=10):.3f} ms "
          "(CUDA events, median of 10)\n")
    print(top_kernels("trunk", lambda: fwd_bwd(), (), args.top))
    for _ in range(5):
        fns.train_step(*batch)
    print(f"whole step: {cuda_ms(lambda: fns.train_step(*batch), reps=20):.3f} ms\n")
    print(top_kernels("step", fns.train_step, batch, args.top))


if __name__ == "__main__":
    main()
