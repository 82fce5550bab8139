"""The optimizer of --bf16-shadow: SGD with momentum, torch's for every parameter but the
shadowed ones, and one Triton kernel each for those (kernels/lin1/shadow_sgd.py). A
torch.optim.Optimizer, so that the profiler's memory categories see lin1's master and
momentum as optimizer state. The design in full: docs/design.md, this module's section."""

import torch

from kernels.lin1.shadow_sgd import shadow_sgd_step
from training.optimizer import MOMENTUM
from training.parallel import MASTER, MASTER_LOW, MASTER_TIES, local


def shadowed(model) -> list:
    """[(bf16 parameter, its master as optimizer state)] of the model: lin1's, where it is
    shadowed. The state: {"master": fp32}, or under --split-master {"master": the int16
    low half, "master_ties": its tie bits} (the parameter the high half)."""
    if hasattr(model, MASTER):
        return [(model.lin1.weight, {"master": getattr(model, MASTER)})]
    if hasattr(model, MASTER_LOW):
        return [(model.lin1.weight, {"master": getattr(model, MASTER_LOW),
                                     "master_ties": getattr(model, MASTER_TIES)})]
    return []


class SGDWithShadow(torch.optim.Optimizer):
    """make(params)'s optimizer for every parameter but the shadowed ones, stepped first;
    then each shadowed one's kernel. state[param] holds "master" (and "master_ties") and,
    from the first step on, "momentum_buffer" (as torch's SGD names it)."""

    def __init__(self, model, params, make, lr: float):
        self.shadows = shadowed(model)
        # --lin1-update-beside-trunk: what runs the shadowed updates from their gradients'
        # hooks instead (training/speedups/lin1_update_beside_trunk.py), or None.
        self.updated_elsewhere = None
        # --skip-unchanged-weight: the split kernel stores the weight only where it changed.
        self.skip_unchanged_weight = False
        # --float8-lin1: a shadowed weight's float8 copies, {id(param): (w8, w8t, state,
        # inverse)}: its update's kernel writes w8 as it writes the weight, after the
        # scale's roll; the transposed w8t follows, all on the update's stream.
        self.float8_copies = {}
        shadows = {id(p) for p, _ in self.shadows}
        self.inner = make([p for p in params if id(p) not in shadows])
        super().__init__([p for p, _ in self.shadows], {"lr": lr})
        for param, master in self.shadows:
            self.state[param].update(master)

    @property
    def buffers(self) -> list:
        """Each shadowed parameter's momentum (None before the first step)."""
        return [self.state[p].get("momentum_buffer") for p, _ in self.shadows]

    @torch.no_grad()
    def step(self) -> None:
        self.inner.step()
        if self.updated_elsewhere is None:
            for param, _ in self.shadows:
                self.update(param)

    @torch.no_grad()
    def update(self, param) -> None:
        """One shadowed parameter's step: one launch on the current stream, no sync."""
        if param.grad is None:
            return  # as torch's SGD: a parameter without gradient stays
        lr = self.param_groups[0]["lr"]  # one group, the shadowed parameters'
        state = self.state[param]
        master = state["master"]
        first = "momentum_buffer" not in state  # host-side state: no sync
        if first:
            state["momentum_buffer"] = torch.empty(master.shape, dtype=torch.float32,
                                                   device=master.device)
        # Sharded (--parallel zero or tp): the local rows of the weight and its gradient,
        # beside the master's and momentum's rows (training/parallel.py).
        shadow_sgd_step(master, local(param.grad), state["momentum_buffer"],
                        local(param.data), lr, MOMENTUM, first, state.get("master_ties"),
                        skip_unchanged=self.skip_unchanged_weight,
                        float8=self.float8_copies.get(id(param)))

    def zero_grad(self, set_to_none: bool = True) -> None:
        if self.updated_elsewhere is not None and not set_to_none:
            self.updated_elsewhere.join()  # zeroing in place: the side stream reads it
        self.inner.zero_grad(set_to_none=set_to_none)
        super().zero_grad(set_to_none=set_to_none)
