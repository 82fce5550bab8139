"""lin1's three GEMMs in float8 (kernels/lin1/float8_linear.py): the ladder's first rung that
changes the maths, off by default; the tensor cores run float8 at twice bf16's rate. The
weight's float8 copies and their scale are buffers of lin1, written by each update's
kernel; it builds on --bf16-shadow, one GPU. What it saves and does to the loss:
results/float8.md. The design in full: docs/design.md, this module's section."""

from training.speedups.base import SpeedUp


def float8_forward(model, build) -> None:
    import torch

    from kernels.lin1.float8_cast import cast_weight, new_state
    from kernels.lin1.float8_linear import float8_linear
    from training.speedups.base import rebind
    lin1 = model.lin1
    if lin1.weight.dtype != torch.bfloat16:
        return  # --bf16-shadow off: idle says so
    out, features = lin1.weight.shape
    like = dict(dtype=torch.float8_e4m3fn, device=lin1.weight.device)
    lin1.register_buffer("weight_e4m3", torch.empty(out, features, **like))
    lin1.register_buffer("weight_e4m3_t", torch.empty(features, out, **like))
    state, inverse = new_state(lin1.weight)
    lin1.register_buffer("float8_state", state)
    lin1.register_buffer("float8_inverse", inverse)
    cast_weight(lin1.weight.detach(), *copies(lin1))

    def forward(lin1, x):
        return float8_linear(x, lin1.weight, lin1.bias, lin1.weight_e4m3, lin1.weight_e4m3_t,
                             lin1.float8_inverse)
    rebind(lin1, forward)


def copies(lin1) -> tuple:
    return lin1.weight_e4m3, lin1.weight_e4m3_t, lin1.float8_state, lin1.float8_inverse


def cast_in_the_update(model, make, build):
    """The shadow optimizer's update of lin1 writes its copies (SGDWithShadow.float8_copies)."""
    lin1 = model.lin1

    def make_casting(params):
        optimizer = make(params)
        if hasattr(lin1, "weight_e4m3"):
            optimizer.float8_copies[id(lin1.weight)] = copies(lin1)
        return optimizer
    return make_casting


def refusal(asked, cuda: bool) -> str | None:
    from training.ranks import from_env
    from training.speedups.bf16_shadow import SPEEDUP as SHADOW
    reason = SHADOW.refusal(asked, cuda)  # the bf16 weight it casts needs what the shadow does
    if reason:
        return reason
    if from_env().world > 1:
        return "runs on one GPU: no several-rank design of it is built"
    return None


SPEEDUP = SpeedUp(
    "float8_lin1",
    "CHANGES THE MATHS: lin1's three GEMMs in float8 (e4m3, e5m2 for the gradient), one "
    "scale a tensor; its weight cast by each update's kernel (one GPU, with --bf16-shadow)",
    default=False, gpu_only=True, refusal=refusal,
    changes_maths="lin1's GEMMs in float8",
    model=float8_forward, optimizer=cast_in_the_update,
    idle=lambda asked, on: None if on["bf16_shadow"] else
    "it casts --bf16-shadow's bf16 weight, which is off")
