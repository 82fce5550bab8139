"""lin1's weight kept as a bf16 parameter with fp32 master weights, which one Triton kernel
updates together with the momentum, reading the bf16 gradient (kernels/lin1/
shadow_sgd.py): under bf16 autocast the fp32 weight cost two 1.07 B-element casts a step
besides the optimizer (fp32 -> bf16 for the forward's GEMM, the bf16 gradient -> fp32).

The maths is the baseline's: the forward reads bf16(master), as autocast's cast would give;
the gradient is the bf16 one the GEMM makes, as autocast's backward would cast it; the
update and momentum are fp32. It needs bf16 autocast on a GPU: without it the fp32
activations would meet a bf16 weight.

    model.lin1.weight    bf16 parameter (its name kept, its value bf16(master))
    model.lin1_master    fp32 buffer: the old weight's storage, nothing copied

The optimizer is training/shadow_optimizer.py's.
"""

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
