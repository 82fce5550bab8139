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
"""

from training.speedups.base import SpeedUp


def shadow(model, build) -> None:
    import torch

    from training.parallel import MASTER
    master = model.lin1.weight.data
    model.lin1.weight = torch.nn.Parameter(master.to(torch.bfloat16))
    model.register_buffer(MASTER, master)


def shadowed(model) -> list:
    """[(bf16 parameter, fp32 master, PendingGrad or None)] of the model: lin1's, where it
    is shadowed (the pending operands: update_in_gemm's)."""
    from training.parallel import MASTER
    if not hasattr(model, MASTER):
        return []
    return [(model.lin1.weight, getattr(model, MASTER), getattr(model.lin1, "pending", None))]


class SGDWithShadow:
    """make(params)'s optimizer (SGD with momentum) for every parameter but the shadowed
    ones, whose step is one kernel each: the shadow SGD over the bf16 gradient, or, with
    update_in_gemm, the weight-gradient GEMM with the update in its epilogue over the
    operands the backward left (kernels/lin1/dw_update.py). The same step() and
    zero_grad() as a torch optimizer."""

    def __init__(self, model, params, make, lr: float):
        self.shadows = shadowed(model)
        shadows = {id(p) for p, _, _ in self.shadows}
        self.inner = make([p for p in params if id(p) not in shadows])
        self.lr = lr
        self.buffers: list = [None] * len(self.shadows)  # the momentum, made on the first step

    def step(self) -> None:
        import torch

        from kernels.lin1.dw_update import dw_update_step
        from kernels.lin1.shadow_sgd import shadow_sgd_step
        from training.optimizer import MOMENTUM
        from training.parallel import local
        self.inner.step()
        for i, (param, master, pending) in enumerate(self.shadows):
            operands = pending.take() if pending is not None else None
            if operands is None and param.grad is None:
                continue  # as torch's SGD: a parameter without gradient stays
            first = self.buffers[i] is None  # host-side state: no sync
            if first:
                self.buffers[i] = torch.empty_like(master)
            if operands is not None:
                dy, x = operands
                dw_update_step(dy, x, master, self.buffers[i], param.data, self.lr,
                               MOMENTUM, first)
                continue
            # Sharded (--parallel zero or tp): the local rows of the weight and its
            # gradient, beside the master's and momentum's rows (training/parallel.py).
            shadow_sgd_step(master, local(param.grad), self.buffers[i], local(param.data),
                            self.lr, MOMENTUM, first)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)
        for param, _, pending in self.shadows:
            if pending is not None:
                pending.take()  # a backward's operands that no step used
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()


def with_shadow(model, make, build):
    return lambda params: SGDWithShadow(model, params, make, build.lr)


SPEEDUP = SpeedUp(
    "bf16_shadow",
    "lin1's weight as bf16 with fp32 master weights, updated by one Triton kernel that "
    "reads the bf16 gradient (GPU, with --amp)",
    gpu_only=True, refusal=lambda cfg, cuda: None if cuda and cfg.amp else
    "needs bf16 autocast on a CUDA GPU (--amp)",
    model=shadow, optimizer=with_shadow)
