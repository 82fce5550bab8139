"""lin1's bf16 weight written back only where its update changed its bits (--split-master's
update, kernels/lin1/shadow_sgd.py): at lr 1e-4 most of those 2 bytes an element are
written unchanged, and a 32-byte sector none of whose elements changed is never written to
HBM (up to 2.15 GB of the update's 19.4 GB a step). The update is HBM-bound, so fewer bytes
are less time and fewer joules; the maths is --split-master's bit for bit. The design in
full: docs/design.md, this module's section."""

from training.speedups.base import SpeedUp


def skip_unchanged(model, make, build):
    def made(params):
        optimizer = make(params)
        optimizer.skip_unchanged_weight = True  # read by SGDWithShadow.update
        return optimizer
    return made


SPEEDUP = SpeedUp(
    "skip_unchanged_weight",
    "lin1's split shadow SGD stores its bf16 weight only where the update changed it: "
    "HBM writes saved where the learning rate moves few weights past a bf16 rounding "
    "(GPU, with --split-master)",
    gpu_only=True, optimizer=skip_unchanged,
    idle=lambda asked, on: None if on["split_master"] else
    "it changes --split-master's update, which is off")
