"""The step's optimizer as the original ran it: SGD with momentum 0.9 (torch's, foreach on
CUDA unless fused). The speed-ups wrap its maker (training/speedups/: fused_sgd,
bf16_shadow)."""

import torch

from training.parallel import is_sharded

MOMENTUM = 0.9


def momentum_sgd(params, lr: float, fused: bool = False):
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
