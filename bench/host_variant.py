"""train.py under a different host set-up, for experiments on where a range's host time
goes. Not a knob of train.py: these change the machine around the run, not the run.

    python3 bench/host_variant.py --sched spin -- --loss kernel --kernel cuda --mode forward
    python3 bench/host_variant.py --gc freeze -- <train.py options>

--sched: how the CUDA driver waits in a sync (the primary context's scheduling flag, set
through libcuda before torch creates the context): auto (CUDA's default: spin while the
process has fewer contexts than cores), spin, yield, blocking (sleep on an interrupt).
--gc: on (default), off (no cyclic collection), freeze (collect once, then move every
object to a generation the collector never scans).
--empty-loss: the strategy's loss returns a tensor made once, with no work: the loss range
then holds only its record_function and the sync that closes it, the floor of that range
in a real step (the loss values printed are then that constant, not a loss).
"""

import argparse
import ctypes
import gc
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

# CUctx_flags: CU_CTX_SCHED_AUTO 0, SPIN 1, YIELD 2, BLOCKING_SYNC 4.
SCHED = {"auto": 0, "spin": 1, "yield": 2, "blocking": 4}


def set_sched(flag: int, device: int = 0) -> None:
    cuda = ctypes.CDLL("libcuda.so.1")
    check = lambda rc, what: rc == 0 or sys.exit(f"error: {what} returned CUresult {rc}")
    check(cuda.cuInit(0), "cuInit")
    dev = ctypes.c_int()
    check(cuda.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
    set_flags = getattr(cuda, "cuDevicePrimaryCtxSetFlags_v2", None) or \
        cuda.cuDevicePrimaryCtxSetFlags
    check(set_flags(dev, flag), "cuDevicePrimaryCtxSetFlags")


def stub_losses() -> None:
    """Make losses.get return strategies whose loss does nothing (see --empty-loss)."""
    import dataclasses
    import losses
    import torch
    real_get = losses.get
    made = {}

    def empty_loss(pred, targets):
        if pred.device not in made:
            made[pred.device] = pred.new_zeros((), dtype=torch.float32)
        return made[pred.device]

    losses.get = lambda *a, **k: dataclasses.replace(real_get(*a, **k), loss=empty_loss)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sched", choices=SCHED, default="auto")
    parser.add_argument("--gc", choices=("on", "off", "freeze"), default="on")
    parser.add_argument("--empty-loss", action="store_true")
    args, train_args = parser.parse_known_args()
    if train_args[:1] == ["--"]:
        train_args = train_args[1:]
    if args.sched != "auto":
        set_sched(SCHED[args.sched])
    import train
    if args.empty_loss:
        stub_losses()
    if args.gc == "off":
        gc.disable()
    elif args.gc == "freeze":
        gc.collect()
        gc.freeze()
    return train.main(train_args)


if __name__ == "__main__":
    sys.exit(main())
