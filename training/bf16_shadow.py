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

from kernels.triton_shadow_sgd import shadow_sgd_step

MOMENTUM = 0.9


class SGDWithShadow:
    """torch's SGD (momentum 0.9) for every parameter but the shadowed ones, whose step is
    one kernel each. The same step()/zero_grad() as a torch optimizer."""

    def __init__(self, model, lr: float, fused: bool):
        self.shadows = model.shadowed()  # [(bf16 parameter, fp32 master)]
        shadowed = {id(p) for p, _ in self.shadows}
        rest = [p for p in model.parameters() if id(p) not in shadowed]
        self.inner = torch.optim.SGD(rest, lr=lr, momentum=MOMENTUM,
                                     **({"fused": True} if fused else {}))
        self.lr = lr
        self.buffers: list[torch.Tensor | None] = [None] * len(self.shadows)

    def step(self) -> None:
        self.inner.step()
        for i, (param, master) in enumerate(self.shadows):
            if param.grad is None:  # as torch's SGD: a parameter without gradient stays
                continue
            first = self.buffers[i] is None  # host-side state: no sync
            if first:
                self.buffers[i] = torch.empty_like(master)
            shadow_sgd_step(master, param.grad, self.buffers[i], param.data, self.lr,
                            MOMENTUM, first)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)
        for param, _ in self.shadows:
            if set_to_none:
                param.grad = None
            elif param.grad is not None:
                param.grad.zero_()
