"""A linear layer whose weight gradient is left to the optimizer (`--update-in-gemm`): its
backward computes the input's and the bias's gradients and hands the weight GEMM's two
operands, dY and X, to a PendingGrad instead of making dW. The optimizer's step then runs
the GEMM with the update in its epilogue (kernels/lin1/dw_update.py), so the weight's
2.1 GB bf16 gradient never exists and weight.grad stays None.

    pending = PendingGrad()
    y = deferred_linear(x, weight, bias, pending)   # forward: F.linear
    y.sum().backward()                              # x.grad, bias.grad; pending holds dY, X
    dy, x = pending.take()                          # the optimizer's: then empty again

Gradients as autocast's F.linear gives them (bf16 x and weight, bias cast to bf16 in the
forward): dX = dY @ W and dbias = sum over the batch of dY in bf16, handed to the fp32
bias as its cast's backward would. The backward reads the weight before the optimizer
changes it in place: its version counter moves only after the backward is over.

Not traced by torch.compile (its backward stores into a Python object): a model that uses
it compiles its trunk only (model/build.py's compile_whole, which the update_in_gemm
speed-up sets).
"""

import torch
import torch.nn.functional as F


class PendingGrad:
    """dY and X of the layer's last backward until the optimizer takes them."""

    def __init__(self):
        self.operands: tuple[torch.Tensor, torch.Tensor] | None = None

    def put(self, dy: torch.Tensor, x: torch.Tensor) -> None:
        self.operands = (dy, x)

    def take(self) -> tuple[torch.Tensor, torch.Tensor] | None:
        """The operands, once: a step without a backward before it finds None."""
        operands, self.operands = self.operands, None
        return operands


class _DeferredWeightLinear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias, pending):
        x = x.contiguous()  # the GEMM's operand as the update kernel reads it
        ctx.save_for_backward(x, weight)
        ctx.pending = pending
        ctx.bias_dtype = None if bias is None else bias.dtype
        return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dy = dy.contiguous()
        ctx.pending.put(dy, x)
        dx = dy @ weight.to(dy.dtype) if ctx.needs_input_grad[0] else None
        dbias = None
        if ctx.bias_dtype is not None and ctx.needs_input_grad[2]:
            dbias = dy.sum(0).to(ctx.bias_dtype)
        return dx, None, dbias, None


def deferred_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    pending: PendingGrad) -> torch.Tensor:
    """F.linear(x, weight, bias) whose weight gradient is pending's operands instead."""
    return _DeferredWeightLinear.apply(x, weight, bias, pending)
