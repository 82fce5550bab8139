"""The optimizer of --bf16-shadow (training/speedups/bf16_shadow.py): SGD with momentum,
torch's for every parameter but the shadowed ones, and for those one Triton kernel each
(kernels/lin1/shadow_sgd.py) over the bf16 gradient, the fp32 master and the momentum.

A torch.optim.Optimizer, so that what torch.profiler learns from an optimizer's step (its
param_groups and state, read where the step returns) holds for lin1 too: its bf16 weight
is a parameter, its master and momentum are optimizer state. Without that, --memory-
snapshot's categories saw the master and momentum (8.6 GB at the GPU preset) nowhere,
and the bf16 weight as an input.
"""

import torch

from kernels.lin1.shadow_sgd import shadow_sgd_step
from training.optimizer import MOMENTUM
from training.parallel import MASTER, local


def shadowed(model) -> list:
    """[(bf16 parameter, fp32 master)] of the model: lin1's, where it is shadowed."""
    if not hasattr(model, MASTER):
        return []
    return [(model.lin1.weight, getattr(model, MASTER))]


class SGDWithShadow(torch.optim.Optimizer):
    """make(params)'s optimizer for every parameter but the shadowed ones, stepped first;
    then each shadowed one's kernel. state[param] holds "master" and, from the first step
    on, "momentum_buffer" (as torch's SGD names it)."""

    def __init__(self, model, params, make, lr: float):
        self.shadows = shadowed(model)
        shadows = {id(p) for p, _ in self.shadows}
        self.inner = make([p for p in params if id(p) not in shadows])
        super().__init__([p for p, _ in self.shadows], {"lr": lr})
        for param, master in self.shadows:
            self.state[param]["master"] = master

    @property
    def buffers(self) -> list:
        """Each shadowed parameter's momentum (None before the first step)."""
        return [self.state[p].get("momentum_buffer") for p, _ in self.shadows]

    @torch.no_grad()
    def step(self) -> None:
        self.inner.step()
        lr = self.param_groups[0]["lr"]  # one group, the shadowed parameters'
        for param, master in self.shadows:
            if param.grad is None:
                continue  # as torch's SGD: a parameter without gradient stays
            state = self.state[param]
            first = "momentum_buffer" not in state  # host-side state: no sync
            if first:
                state["momentum_buffer"] = torch.empty_like(master)
            # Sharded (--parallel zero or tp): the local rows of the weight and its
            # gradient, beside the master's and momentum's rows (training/parallel.py).
            shadow_sgd_step(master, local(param.grad), state["momentum_buffer"],
                            local(param.data), lr, MOMENTUM, first)

    def zero_grad(self, set_to_none: bool = True) -> None:
        self.inner.zero_grad(set_to_none=set_to_none)
        super().zero_grad(set_to_none=set_to_none)
