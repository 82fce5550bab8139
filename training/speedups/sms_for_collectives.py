"""Under --parallel tp (and tp2d), the two GEMMs that run while a collective is in flight
(training/tensor_parallel.py's BESIDE) leave SMS_LEFT SMs to NCCL: cuBLAS's persistent
Hopper GEMMs hold every SM, and NCCL's CTAs cannot share one, so the collectives waited for
the GEMMs they were to hide behind. The same sums; torch's once-a-process warning about the
carveout is ignored (NOTE). The design in full: docs/design.md, this module's section."""

import contextlib
import warnings

from training.speedups.base import SpeedUp

SMS_LEFT = 24
WEIGHT_GRADIENT_SHARE = 0.25
# torch's warning at the first carveout (ATen's Context.cpp), matched from its start.
NOTE = "Setting the SM carveout for matmuls is a temporary experimental mitigation"


@contextlib.contextmanager
def sms_left(device):
    """cuBLASLt's GEMMs inside leave SMS_LEFT SMs free (on a CUDA device; else nothing)."""
    import torch
    if device.type != "cuda":
        yield
        return
    before = torch._C._get_sm_carveout_experimental()
    torch._C._set_sm_carveout_experimental(SMS_LEFT)
    try:
        yield
    finally:
        torch._C._set_sm_carveout_experimental(before)


def own_rows_carved(bias, x, weight, out) -> None:
    """out = x @ weight^T + bias with SMS_LEFT SMs left to the gather beside it."""
    import torch
    with sms_left(x.device):
        torch.addmm(bias, x, weight.t(), out=out)


def weight_gradient_carved(dy, full):
    """dW = dy^T @ full, its first WEIGHT_GRADIENT_SHARE of rows with SMS_LEFT SMs left
    to the reduce-scatter beside it, the rest on every SM."""
    import torch
    rows = dy.shape[1]
    carved = max(1, min(rows, round(rows * WEIGHT_GRADIENT_SHARE)))
    dw = full.new_empty((rows, full.shape[1]))
    with sms_left(dy.device):  # addmm, not mm: cuBLASLt's path, which heeds the carveout
        torch.addmm(full.new_zeros(full.shape[1]), dy[:, :carved].t(), full,
                    out=dw[:carved])
    if carved < rows:
        torch.mm(dy[:, carved:].t(), full, out=dw[carved:])
    return dw


def swap_gemms(on: bool, cuda: bool, many_runs: bool) -> None:
    """Every run sets tp's GEMMs beside its collectives: carved where this is on, plain
    where off (a process of several runs, make compare's, gets each run's own)."""
    from training import tensor_parallel
    if not (on and cuda):
        tensor_parallel.BESIDE = tensor_parallel.Beside()
        return
    # torch's note, known and said in the module's docstring, not stderr's
    warnings.filterwarnings("ignore", message=NOTE, category=UserWarning)
    tensor_parallel.BESIDE = tensor_parallel.Beside(own_rows_carved, weight_gradient_carved)


def refusal(asked, cuda: bool) -> str | None:
    if asked.design not in ("tp", "tp2d"):
        return "only --parallel tp and tp2d run a GEMM beside a collective"
    import torch
    if not hasattr(torch._C, "_set_sm_carveout_experimental"):
        return "this torch has no SM carveout for its GEMMs"
    return None


SPEEDUP = SpeedUp(
    "sms_for_collectives",
    "under --parallel tp or tp2d, lin1's GEMMs beside a collective leave 24 SMs to NCCL, "
    "so the collective runs beside them: auto (the default: tp or tp2d on a GPU), on, off",
    default="auto", gpu_only=True, several_ranks=True, refusal=refusal,
    idle=lambda asked, on: "the copy engines move tp's collectives (--copy-engine-collectives)"
    if on["copy_engine_collectives"] else None,
    process=swap_gemms)
