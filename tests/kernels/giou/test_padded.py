"""The fused kernels: both variants, odd shapes, any target dtype, bad inputs, custom-op
checks. On CPU the Triton kernels run in Triton's interpreter; the `gpu`-marked cases
run both backends on CUDA (make test-gpu)."""

import pytest
import torch

import losses
from core.errors import InputError
from kernels.giou import BackendUnavailable, giou_loss
from tests.cases import make_case
from tests.helpers import REPO, backward_into_nan_memory
from tests.reference import DTYPES, check_against_reference, reference_loss, rel_err

gpu = pytest.mark.gpu
# (backend, device): the Triton kernels everywhere, the CUDA kernels on a GPU only.
TARGETS = [pytest.param("triton", "cpu", id="triton-cpu"),
           pytest.param("triton", "cuda", id="triton-cuda", marks=gpu),
           pytest.param("cuda", "cuda", id="cuda-cuda", marks=gpu)]
VARIANTS = ("kernel", "conditional")


@pytest.mark.parametrize("backend,device", TARGETS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("M", (1, 7, 256, 1000))
@pytest.mark.parametrize("B", (1, 3))
def test_kernel_matches_reference(backend, device, variant, dtype, M, B):
    strategy = losses.get(variant, backend=backend)
    check_against_reference(strategy, make_case("mixed", B, M, dtype), device)


@pytest.mark.parametrize("backend,device", TARGETS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("counts", ("empty", "full"))
def test_kernel_counts_zero_and_full(backend, device, variant, counts):
    case = make_case("mixed", 4, 256, torch.bfloat16, counts=counts)
    check_against_reference(losses.get(variant, backend=backend), case, device)


@pytest.mark.parametrize("backend,device", TARGETS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_counts_at_chunk_boundaries(backend, device, variant):
    """Samples longer than a program's chunk (kernels/giou/triton_padded.py SHAPES: 1024 slots,
    walked 128 at a time; giou.cu's conditional blocks the same, its kernel blocks 256
    slots): counts just below, at and past each chunk's and each step's edge, in three
    chunks, the last one partial."""
    from kernels.giou.triton_padded import SHAPES
    chunk, step = SHAPES[True]["CHUNK"], SHAPES[True]["BLOCK"]
    M = 2 * chunk + step // 2 + 3
    counts = [0, 1, step - 1, step, step + 1, chunk - 1, chunk, chunk + 1, 2 * chunk,
              2 * chunk + 1, M - 1, M]
    case = make_case("mixed", len(counts), M, torch.bfloat16)
    case.counts = torch.tensor(counts, dtype=torch.int32)
    case.targets = [case.boxes[b, :n].clone() for b, n in enumerate(counts)]
    check_against_reference(losses.get(variant, backend=backend), case, device)


@pytest.mark.parametrize("backend,device", TARGETS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_every_gradient_slot_is_written(backend, device, variant, monkeypatch):
    """The gradient is an uninitialised allocation, so the kernels must write every slot,
    valid or not. Fresh memory often reads as zeros, which would hide a skipped slot; here
    it holds NaN instead (tests.helpers.backward_into_nan_memory)."""
    from kernels.giou.triton_padded import SHAPES
    case = make_case("mixed", 4, SHAPES[True]["CHUNK"] + 37, torch.bfloat16).to(device)
    pred = case.pred.clone().requires_grad_(True)
    loss = giou_loss(pred, case.boxes, case.counts, backend, variant == "conditional")
    backward_into_nan_memory(loss, pred, monkeypatch)
    assert torch.isfinite(pred.grad).all()
    for b, n in enumerate(case.counts.tolist()):
        assert (pred.grad[b, n:] == 0).all(), (b, n)


@pytest.mark.parametrize("backend,device", TARGETS)
@pytest.mark.parametrize("target_dtype", (torch.uint8, torch.int16, torch.int32, torch.int64,
                                          torch.float16, torch.float32), ids=str)
def test_any_target_dtype_and_int64_counts(backend, device, target_dtype):
    case = make_case("random", 3, 33, torch.float32, target_dtype=target_dtype)
    case.counts = case.counts.long()
    check_against_reference(losses.get("conditional", backend=backend), case, device)


@pytest.mark.parametrize("backend,device", TARGETS)
@pytest.mark.parametrize("variant", VARIANTS)
def test_strided_predictions_are_read_in_place(backend, device, variant):
    case = make_case("random", 3, 40, torch.bfloat16)
    # [M, B, 4] transposed to [B, M, 4]: same values, non-contiguous strides.
    case.pred = case.pred.transpose(0, 1).contiguous().transpose(0, 1)
    assert not case.pred.is_contiguous()
    check_against_reference(losses.get(variant, backend=backend), case, device)


@pytest.mark.parametrize("backend,device", TARGETS)
@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("M", (16, 2051))  # one chunk; three (conditional's 1024 slots)
def test_bad_counts_poison_the_loss_instead_of_reading_out_of_bounds(backend, device, variant,
                                                                     M):
    """Counts cannot be range-checked without a sync; a bad one makes the loss NaN, and
    every slot of that sample's gradient, in every chunk."""
    case = make_case("random", 3, M, torch.float32).to(device)
    for bad in (-1, M + 1, 2**32 + 1):  # the last one wraps to 1 in int32
        if bad > 2**31 and case.counts.dtype != torch.int64:
            case.counts = case.counts.long()
        counts = case.counts.clone()
        counts[1] = bad
        pred = case.pred.clone().requires_grad_(True)
        loss = giou_loss(pred, case.boxes, counts, backend, variant == "conditional")
        loss.backward()
        assert torch.isnan(loss)
        assert torch.isnan(pred.grad[1]).all()
        assert torch.isfinite(pred.grad[0]).all() and torch.isfinite(pred.grad[2]).all()


@pytest.mark.parametrize("backend,device", TARGETS)
def test_conditional_and_kernel_agree_bit_for_bit_on_gradients(backend, device):
    """Same maths per slot: only which slots are touched differs."""
    case = make_case("mixed", 6, 100, torch.bfloat16).to(device)
    grads = []
    for conditional in (False, True):
        pred = case.pred.clone().requires_grad_(True)
        giou_loss(pred, case.boxes, case.counts, backend, conditional).backward()
        grads.append(pred.grad)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("backend,device", TARGETS)
def test_bad_inputs_are_clear_errors(backend, device):
    case = make_case("random", 2, 8, torch.float32).to(device)
    p, t, n = case.pred, case.boxes, case.counts
    bad = {
        "predictions must be a \\[batch, slots, 4\\]": (p[0], t, n),
        "predictions must be fp16": (p.to(torch.int32), t, n),
        "must have the predictions' shape": (p, t[:, :4], n),
        "counts must be a \\[2\\]": (p, t, n[:1]),
        "counts must be int32 or int64": (p, t, n.float()),
        "must be on one device": (p, t, n.to("meta")),
        "integer or float": (p, t.bool(), n),
    }
    for message, args in bad.items():
        with pytest.raises(InputError, match=message):
            giou_loss(*args, backend=backend)


@gpu
def test_cuda_backend_given_cpu_tensors_says_so():
    """CPU or mixed-device inputs to the CUDA backend are InputErrors; what only
    the C++ op checks (contiguous counts) is its RuntimeError."""
    case = make_case("random", 2, 8, torch.float32)
    with pytest.raises(InputError, match="needs CUDA tensors, got cpu"):
        giou_loss(case.pred, case.boxes, case.counts, backend="cuda")
    with pytest.raises(InputError, match="must be on one device"):
        giou_loss(case.pred.cuda(), case.boxes, case.counts, backend="cuda")
    with pytest.raises(RuntimeError, match="counts must be contiguous"):  # C++ only
        giou_loss(case.pred.cuda(), case.boxes.cuda(),
                  case.counts.cuda().repeat(2)[::2], backend="cuda")


@gpu
@pytest.mark.parametrize("requires_grad", (False, True))
def test_cuda_op_called_directly_rejects_bad_inputs(requires_grad):
    """torch.ops.giou_cuda.loss without the Python wrapper: every mistake is an error
    raised by the op (its C++ checks, its dtype dispatch or its fake), never a crash and
    never a result. A number streamed into a check's message once crashed it; meta inputs
    beside CUDA ones once reached the fake and came back as an uninitialised loss."""
    from kernels.giou.cuda_extension import load
    load()
    op = torch.ops.giou_cuda.loss.default
    case = make_case("random", 2, 8, torch.float32).to("cuda")
    p, t, n = case.pred.requires_grad_(requires_grad), case.boxes, case.counts
    bad = {
        "predictions must be \\[batch, slots, 4\\], got \\[8, 4\\]": (p[0], t, n),
        "not implemented for 'Int'": (p.detach().to(torch.int32), t, n),
        "targets \\[2, 4, 4\\] must have the predictions' shape \\[2, 8, 4\\]": (p, t[:, :4], n),
        "counts must be \\[2\\], got \\[1\\]": (p, t, n[:1]),
        "counts must be int32 or int64": (p, t, n.float()),
        "must be on one device": (p, t, n.to("meta")),
        "not implemented for 'Bool'": (p, t.bool(), n),
        "must be on one device, got cuda:0, cpu": (p, t.cpu(), n),
        "'CPU' backend": (p.detach().cpu(), t.cpu(), n.cpu()),
    }
    for message, args in bad.items():
        for conditional in (False, True):
            with pytest.raises(RuntimeError, match=message):
                op(*args, conditional)
    # The grid's second dimension holds at most 65535 chunks of a sample's slots: 256 slots
    # a chunk in the kernel variant, 1024 in the conditional one (giou.cu Shape), so one
    # slot more is an error. Expanded views: nothing that size is allocated.
    big = make_case("random", 1, 1, torch.float32).to("cuda")
    for conditional, chunk in ((False, 256), (True, 1024)):
        M = 65535 * chunk + 1
        pred, boxes = big.pred.expand(1, M, 4), big.boxes.expand(1, M, 4)
        with pytest.raises(RuntimeError, match=f"too many slots per sample: {M} "):
            op(pred, boxes, big.counts, conditional)


def test_cuda_backend_without_gpu_says_what_it_needs():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(BackendUnavailable, match="needs a CUDA GPU and nvcc"):
        losses.get("kernel", backend="cuda")
    with pytest.raises(ValueError, match="unknown kernel backend 'opencl'"):
        losses.get("kernel", backend="opencl")


@pytest.mark.parametrize("backend,device", TARGETS)
def test_opcheck(backend, device):
    """Schema, fake implementation, autograd registration and AOT dispatch of the op."""
    case = make_case("random", 3, 16, torch.float32).to(device)
    if backend == "triton":
        import kernels.giou.triton_padded  # noqa: F401  registers giou::triton_loss
        op = torch.ops.giou.triton_loss.default
    else:
        from kernels.giou.cuda_extension import load
        load()
        op = torch.ops.giou_cuda.loss.default
    for conditional in (False, True):
        for requires_grad in (False, True):
            torch.library.opcheck(op, (case.pred.clone().requires_grad_(requires_grad),
                                       case.boxes, case.counts, conditional))


@pytest.mark.parametrize("backend,device", TARGETS)
def test_float64_predictions_compute_in_float64(backend, device):
    case = make_case("random", 2, 9, torch.float64).to(device)
    pred = case.pred.clone().requires_grad_(True)
    loss = giou_loss(pred, case.boxes, case.counts, backend)
    loss.backward()
    ref_loss, ref_grad = reference_loss(case.pred, case.boxes, case.counts)
    assert loss.dtype == torch.float64
    assert rel_err(loss, ref_loss, 1.0) < 1e-12
    assert rel_err(pred.grad, ref_grad) < 1e-10


def test_triton_imported_before_the_interpreter_is_a_clear_error():
    """On a CPU-only machine TRITON_INTERPRET=1 must be set before triton is imported;
    a program that imported triton first gets one clear error, not an InterpreterError
    from inside a kernel."""
    import os
    import subprocess
    import sys
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    code = ("import triton, losses\n"
            "try:\n    losses.get('kernel')\n"
            "except Exception as e:\n    print(type(e).__name__, e)\n")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300, env=env, cwd=REPO)
    assert done.stdout.startswith("BackendUnavailable triton was imported before "
                                  "TRITON_INTERPRET=1 was set"), done.stdout + done.stderr
