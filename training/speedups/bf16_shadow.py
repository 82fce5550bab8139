"""lin1's weight kept as a bf16 parameter with fp32 master weights, which one Triton kernel
(kernels/lin1/shadow_sgd.py) updates with the momentum from the bf16 gradient: under bf16
autocast the fp32 weight cost two casts of 1.07 B elements a step. The maths is the
baseline's; it needs bf16 autocast on a GPU. The design in full: docs/design.md, this
module's section."""

from training.speedups.base import SpeedUp


def shadow(model, build) -> None:
    import torch

    from training.parallel import MASTER
    master = model.lin1.weight.data
    model.lin1.weight = torch.nn.Parameter(master.to(torch.bfloat16))
    model.register_buffer(MASTER, master)


def with_shadow(model, make, build):
    from training.shadow_optimizer import SGDWithShadow  # imports torch
    return lambda params: SGDWithShadow(model, params, make, build.lr)


SPEEDUP = SpeedUp(
    "bf16_shadow",
    "lin1's weight as bf16 with fp32 master weights, updated by one Triton kernel that "
    "reads the bf16 gradient (GPU, with --amp)",
    gpu_only=True, refusal=lambda asked, cuda: None if cuda and asked.amp else
    "needs bf16 autocast on a CUDA GPU (--amp)",
    model=shadow, optimizer=with_shadow)
