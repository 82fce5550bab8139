"""lin1's bf16 weight written back only where its update changed it. The split shadow SGD
(kernels/lin1/shadow_sgd.py, --split-master) reads each element's bf16 weight, the master's
high half, and writes it back; at the workload's learning rate (1e-4) an update moves the
fp32 master by far less than the bf16 weight's last place, so most of those 2 bytes an
element are written unchanged. Stored under a mask (the new bits differ from the old), a
32-byte sector none of whose 16 elements changed is never dirtied in L2 and never written
to HBM: up to 2.15 GB less a step of the update's 19.4 GB for lin1's 1.07 B weights.

Why it pays: the update is bound by HBM's bandwidth (90 % of it), so 11 % fewer bytes make
it ~11 % shorter beside the trunk, and at the GPU preset, where the step runs at the card's
700 W cap, a step that moves fewer bytes needs fewer joules. What it saves depends on the
data: a sector is written when any of its 16 weights moves across a bf16 rounding
boundary, 0.12 % of the weights a step at the preset (results/step.md has the A/B).

The maths is --split-master's bit for bit: an element whose bits are unchanged is left as
it was. It needs that form (the plain fp32 master's kernel does not read the bf16 weight,
and reading it only to skip its write would move as many bytes).
"""

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
