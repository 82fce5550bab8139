"""--bf16-shadow: lin1's weight is a bf16 parameter with fp32 master weights kept by the
optimizer (kernels/triton_shadow_sgd.py says why and what it moves).

    model = BoxNet(..., bf16_shadow=True)      # lin1.weight bf16; model.lin1_master fp32
                                               # (model/boxnet.make_shadow)
    optimizer = SGDWithShadow(model, lr, fused=True)

The maths is the baseline's: the forward reads bf16(master), as autocast's cast would give;
the gradient is the bf16 one the GEMM makes, as autocast's backward would cast it; the
update and momentum are fp32. It needs bf16 autocast (without it the fp32 activations
would meet a bf16 weight).
"""

import torch

from kernels.triton_dw_update import dw_update_step
from kernels.triton_shadow_sgd import shadow_sgd_step
from training.parallel import is_sharded, local

MOMENTUM = 0.9


def momentum_sgd(params, lr: float, fused: bool):
    """torch's SGD with momentum 0.9 over params: fused where asked, except for sharded
    parameters (DTensors of --parallel zero or tp), whose fused step has no DTensor rule
    in torch 2.11 (aten._fused_sgd_); they take the foreach step, one optimizer beside."""
    params = list(params)
    sharded = [p for p in params if is_sharded(p)]
    plain = [p for p in params if not is_sharded(p)]
    opts = [torch.optim.SGD(group, lr=lr, momentum=MOMENTUM, **kwargs)
            for group, kwargs in ((plain, {"fused": True} if fused else {}),
                                  (sharded, {"foreach": True})) if group]
    if len(opts) < 2:  # one group, or none: torch's own refusal of an empty list
        return opts[0] if opts else torch.optim.SGD(plain, lr=lr, momentum=MOMENTUM)
    return _Together(opts)


class _Together:
    """Several optimizers stepped as one."""

    def __init__(self, optimizers):
        self.optimizers = optimizers

    def step(self) -> None:
        for opt in self.optimizers:
            opt.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=set_to_none)


class SGDWithShadow:
    """torch's SGD (momentum 0.9) for every parameter but the shadowed ones, whose step is
    one kernel each: the shadow SGD over the bf16 gradient, or, with --update-in-gemm, the
    weight-gradient GEMM with the update in its epilogue over the operands the backward
    left (kernels/triton_dw_update.py). The same step()/zero_grad() as a torch optimizer."""

    def __init__(self, model, lr: float, fused: bool):
        self.shadows = model.shadowed()  # [(bf16 parameter, fp32 master, PendingGrad)]
        shadowed = {id(p) for p, _, _ in self.shadows}
        rest = [p for p in model.parameters() if id(p) not in shadowed]
        self.inner = momentum_sgd(rest, lr, fused)
        self.lr = lr
        self.buffers: list[torch.Tensor | None] = [None] * len(self.shadows)

    def step(self) -> None:
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
