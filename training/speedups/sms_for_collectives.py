"""Under --parallel tp (and tp2d), the two GEMMs that run beside a collective
(training/tensor_parallel.py's BESIDE) leave SMS_LEFT SMs to NCCL, so the collective runs
beside them rather than after them.

Why: on Hopper cuBLAS's big GEMMs are persistent, one CTA on every SM with 189-213 KB of
shared memory each, and NCCL's CTAs (24 of 104 KB on two H200s) cannot share an SM with
one. A collective launched beside such a GEMM waited for its end: dx's reduce-scatter for
the whole weight-gradient GEMM (2 (H/N)(NB)F = 2.2 TFLOP at the GPU preset on 2 ranks,
~2.5 ms), and the features' all-gather for part of the own rows' GEMM; 0.8-0.9 ms of
NCCL's 1.8 ms a step was exposed (results/several-gpus.md).

What runs here instead:
    own rows   x @ W^T + b (1.1 TFLOP, ~1.4 ms) as one GEMM with SMS_LEFT SMs left; the
               gather (N-1)BF bf16, 134 MB on 2 ranks, ~0.4 ms on NVLink) runs beside it
    dW         cut along its rows: the first WEIGHT_GRADIENT_SHARE of them with SMS_LEFT
               SMs left (~0.7 ms, more than the reduce-scatter's ~0.4 ms), the rest on
               every SM, so the SMs are given up for no longer than the collective needs
The carveout reaches cuBLASLt's GEMMs only (its SM-count target); a plain mm goes to
cuBLAS, which ignores it, so the carved part of dW is an addmm with a zero bias (128 KB
a step at the GPU preset), which takes cuBLASLt's path. Each element of dW is the same
sum over the batch: the maths are the baseline's, its rounding may differ in bf16's last
place where the GEMM's kernel does (held to the plain GEMMs' losses in make test-gpu).

At the first carveout torch warns, once a process, that the setting is a temporary,
experimental mitigation; inside an autograd function that is a Python UserWarning on each
rank's stderr, where a failed job promises one line (tests/training/test_gpu_failures.py),
so a run that turns this on ignores that one message (NOTE). Under the graphed head the
carved GEMMs are what the graphs capture. SMS_LEFT is what NCCL took on two H200s; the
shares are those of the settings tried that hid the most (results/several-gpus.md), not
tuned per machine.
"""

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
    if on and cuda:  # torch's note, known and said in the module's docstring, not stderr's
        warnings.filterwarnings("ignore", message=NOTE, category=UserWarning)
    tensor_parallel.BESIDE = (
        tensor_parallel.Beside(own_rows_carved, weight_gradient_carved) if on and cuda
        else tensor_parallel.Beside())


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
    process=swap_gemms)
