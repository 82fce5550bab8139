"""--sms-for-collectives: the carved GEMMs give the plain ones' products (against float64,
fresh inputs, row counts that cut dW unevenly or not at all, fp32 and bf16), the carveout
is set only inside and restored after an error, each run gets its own GEMMs, and torch's
note at the first carveout stays off a run's stderr. On NCCL ranks its losses are the
plain GEMMs' (tests/training/test_gpu_distributed.py)."""

import subprocess
import sys

import pytest
import torch

from tests.helpers import REPO
from training import tensor_parallel
from training.speedups import sms_for_collectives as carved

# bf16 products summed over the batch in fp32: the result's own rounding dominates.
TOLERANCE = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return ((got.double() - want).norm() / want.norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [1, 3, 4, 7, 64])
def test_the_weight_gradient_cut_along_its_rows_is_the_whole_product(rows, dtype):
    batch, features = 24, 40
    dy = torch.randn(batch, rows).to(dtype)
    full = torch.randn(batch, features).to(dtype)
    got = carved.weight_gradient_carved(dy, full)
    want = dy.double().t() @ full.double()
    assert got.shape == (rows, features) and got.dtype == dtype
    assert _relative_error(got, want) < TOLERANCE[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_own_rows_gemm_writes_its_rows_of_the_output(dtype):
    x, weight, bias = (torch.randn(6, 32).to(dtype), torch.randn(10, 32).to(dtype),
                       torch.randn(10).to(dtype))
    out = torch.full((12, 10), float("nan"), dtype=dtype)
    carved.own_rows_carved(bias, x, weight, out[3:9])
    want = x.double() @ weight.double().t() + bias.double()
    assert _relative_error(out[3:9], want) < TOLERANCE[dtype]
    assert out[:3].isnan().all() and out[9:].isnan().all()


def test_the_carveout_is_set_inside_only_and_restored_after_an_error():
    get = torch._C._get_sm_carveout_experimental
    before = get()
    with carved.sms_left(torch.device("cpu")):
        assert get() == before  # a CPU GEMM has no SMs to leave
    with pytest.raises(RuntimeError, match="inside"):
        with carved.sms_left(torch.device("cuda")):  # only sets a flag: no GPU needed
            assert get() == carved.SMS_LEFT
            raise RuntimeError("inside")
    assert get() == before


def test_each_run_gets_the_gemms_of_its_own_choice():
    try:
        carved.swap_gemms(True, True, many_runs=True)
        assert tensor_parallel.BESIDE.weight_gradient is carved.weight_gradient_carved
        assert tensor_parallel.BESIDE.own_rows is carved.own_rows_carved
        carved.swap_gemms(False, True, many_runs=True)
        assert tensor_parallel.BESIDE == tensor_parallel.Beside()
        carved.swap_gemms(True, False, many_runs=False)  # on a CPU: nothing to carve
        assert tensor_parallel.BESIDE == tensor_parallel.Beside()
    finally:
        tensor_parallel.BESIDE = tensor_parallel.Beside()


# torch warns at its first carveout, once a process: each case needs a fresh one.
CARVE_IN_A_FUNCTION = """
import torch
from training.speedups import sms_for_collectives as carved
if {swapped}:
    carved.swap_gemms(True, True, many_runs=False)

class Carving(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        with carved.sms_left(torch.device("cuda")):  # only sets a flag: no GPU needed
            return x * 2

    @staticmethod
    def backward(ctx, grad):
        return grad

Carving.apply(torch.ones(2, requires_grad=True)).sum().backward()
"""


@pytest.mark.parametrize("swapped", [False, True])
def test_a_run_with_it_on_keeps_torchs_carveout_note_off_stderr(swapped):
    """A failed job's stderr is one line; torch's note at the first carveout, raised as a
    UserWarning inside an autograd function, would be another on every rank."""
    done = subprocess.run([sys.executable, "-c", CARVE_IN_A_FUNCTION.format(swapped=swapped)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (carved.NOTE in done.stderr) is not swapped, done.stderr[-2000:]
