"""The packed layouts (losses/packed.py, losses/nested.py, losses/compiled_packed.py): the
fused packed kernels on both backends, the nested strategy and Inductor's against the
float64 reference at the sizes and shapes that break things, the collate, the ops'
checks, opcheck; on the GPU (make test-gpu) gradcheck, the launches per call, no sync and
torch.compile."""

import pytest
import torch

import losses
from core.errors import InputError
from data.collate import collate_packed, packed_targets
from tests.cases import make_case
from tests.helpers import backward_into_nan_memory, compiler_marks, kernels_launched
from tests.reference import DTYPES, check_against_reference, reference_loss, rel_err, targets_for

gpu = pytest.mark.gpu
# (strategy, backend, device): the Triton kernel and nested everywhere, CUDA on a GPU.
RUNS = [pytest.param("packed", "triton", "cpu", id="packed-triton-cpu"),
        pytest.param("nested", "triton", "cpu", id="nested-cpu"),
        pytest.param("compiled_packed", "triton", "cpu", id="compiled-packed-cpu",
                     marks=compiler_marks("compiled_packed")),
        pytest.param("packed", "triton", "cuda", id="packed-triton-cuda", marks=gpu),
        pytest.param("packed", "cuda", "cuda", id="packed-cuda-cuda", marks=gpu),
        pytest.param("nested", "triton", "cuda", id="nested-cuda", marks=gpu),
        pytest.param("compiled_packed", "triton", "cuda", id="compiled-packed-cuda",
                     marks=gpu)]


# (backend, device) of the packed kernels.
KERNELS = [pytest.param(*r.values[1:], id=r.id, marks=r.marks) for r in RUNS
           if r.values[0] == "packed"]


@pytest.mark.parametrize("name,backend,device", RUNS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("B,M", [(1, 1), (3, 7), (5, 256), (2, 4096)])
def test_matches_reference(name, backend, device, dtype, B, M):
    case = make_case("mixed", B, M, dtype)
    check_against_reference(losses.get(name, backend=backend), case, device)


@pytest.mark.parametrize("name,backend,device", RUNS)
@pytest.mark.parametrize("counts", ("empty", "full"))
def test_no_box_and_every_slot_filled(name, backend, device, counts):
    case = make_case("mixed", 4, 256, torch.bfloat16, counts=counts).to(device)
    strategy = losses.get(name, backend=backend)
    if counts == "full":
        check_against_reference(strategy, case, device)
        return
    pred = case.pred.clone().requires_grad_(True)
    loss = strategy.loss(pred, targets_for(name, case))
    loss.backward()
    assert loss.item() == 0.0 and torch.equal(pred.grad, torch.zeros_like(pred))


@pytest.mark.parametrize("name,backend,device", RUNS)
def test_strided_predictions_and_int64_index(name, backend, device):
    case = make_case("random", 3, 40, torch.bfloat16)
    case.pred = case.pred.transpose(0, 1).contiguous().transpose(0, 1)
    assert not case.pred.is_contiguous()
    check_against_reference(losses.get(name, backend=backend), case, device)
    case = case.to(device)
    targets = list(targets_for(name, case))
    targets[1] = targets[1].long()
    pred = case.pred.clone().requires_grad_(True)
    loss = losses.get(name, backend=backend).loss(pred, tuple(targets))
    ref_loss, _ = reference_loss(case.pred, case.boxes, case.counts)
    assert rel_err(loss, ref_loss, 1.0) < 1e-5


@pytest.mark.parametrize("backend,device", KERNELS)
@pytest.mark.parametrize("target_dtype", (torch.uint8, torch.int32, torch.float16,
                                          torch.float32), ids=str)
def test_any_box_dtype(backend, device, target_dtype):
    case = make_case("random", 3, 33, torch.float32, target_dtype=target_dtype)
    check_against_reference(losses.get("packed", backend=backend), case, device)


@pytest.mark.parametrize("name,backend,device", RUNS)
def test_every_block_edge(name, backend, device):
    """Box counts just below, at and past a program's block of boxes (256), and images
    of one box, none and many."""
    from kernels.giou.triton_packed import BLOCK
    counts = [0, 1, BLOCK - 1, 0, BLOCK, BLOCK + 1, 2 * BLOCK + 3]
    case = make_case("mixed", len(counts), max(counts), torch.bfloat16)
    case.counts = torch.tensor(counts, dtype=torch.int32)
    case.targets = [case.boxes[b, :n].clone() for b, n in enumerate(counts)]
    check_against_reference(losses.get(name, backend=backend), case, device)


@pytest.mark.parametrize("name,backend,device", RUNS)
@pytest.mark.parametrize("bad", ([0, 24, 24, 36], [0, 12, 10, 36], [-1, 12, 24, 36],
                                 [0, 12, 24, 40]),
                         ids=("count>M", "count<0", "first<0", "past N"))
def test_bad_offsets_poison_the_loss(name, backend, device, bad):
    """Offsets that do not partition the 36 boxes (3 images of M = 12) into counts within
    [0, M]: the loss is NaN (both strategies), and the packed kernel's backward writes NaN
    over every row of an image whose range is bad, never reading outside [0, N)."""
    case = make_case("random", 3, 12, torch.float32, counts="full").to(device)
    boxes, index, _ = targets_for(name, case)
    offsets = torch.tensor(bad, device=device)
    pred = case.pred.clone().requires_grad_(True)
    loss = losses.get(name, backend=backend).loss(pred, (boxes, index, offsets))
    loss.backward()
    where = f"{name} seed={case.seed} offsets={bad}"
    assert torch.isnan(loss), where
    if name == "packed":
        assert torch.isnan(pred.grad).any(), where


@pytest.mark.parametrize("name,backend,device", RUNS)
def test_rows_no_box_names_get_exact_zeros(name, backend, device, monkeypatch):
    """The gradient outside the boxes is zero whatever the allocator hands back: fresh
    memory holds NaN here (tests.helpers.backward_into_nan_memory)."""
    case = make_case("mixed", 4, 300, torch.bfloat16).to(device)
    pred = case.pred.clone().requires_grad_(True)
    loss = losses.get(name, backend=backend).loss(pred, targets_for(name, case))
    backward_into_nan_memory(loss, pred, monkeypatch)
    assert torch.isfinite(pred.grad).all()
    for b, n in enumerate(case.counts.tolist()):
        assert (pred.grad[b, n:] == 0).all(), (b, n)


@pytest.mark.parametrize("backend,device", KERNELS)
def test_float64_predictions_compute_in_float64(backend, device):
    case = make_case("random", 2, 9, torch.float64).to(device)
    pred = case.pred.clone().requires_grad_(True)
    loss = losses.get("packed", backend=backend).loss(pred, targets_for("packed", case))
    loss.backward()
    ref_loss, ref_grad = reference_loss(case.pred, case.boxes, case.counts)
    assert loss.dtype == torch.float64
    assert rel_err(loss, ref_loss, 1.0) < 1e-12
    assert rel_err(pred.grad, ref_grad) < 1e-10


@pytest.mark.parametrize("name,backend,device", RUNS)
def test_bad_inputs_are_clear_errors(name, backend, device):
    case = make_case("random", 2, 8, torch.float32).to(device)
    strategy = losses.get(name, backend=backend)
    p, (boxes, index, offsets) = case.pred, targets_for(name, case)
    bad = {
        "packed targets must be a \\[boxes, 4\\] tensor": (boxes[:, :3], index, offsets),
        "the packed index must be \\[2, ": (boxes, index[:1], offsets),
        "the packed index must be int32 or int64, got torch.float32":
            (boxes, index.float(), offsets),
        "offsets must be a \\[3\\] tensor": (boxes, index, offsets[:2]),
        "offsets must be int32 or int64, got torch.float32": (boxes, index, offsets.float()),
        "must be on one device": (boxes, index.to("meta"), offsets),
        "integer or float": (boxes.bool(), index, offsets),
    }
    for message, targets in bad.items():
        with pytest.raises(InputError, match=message):
            strategy.loss(p, targets)


def test_the_collates_lay_out_the_boxes_on_the_host():
    boxes = [torch.tensor([[1, 2, 3, 4], [5, 6, 7, 8]], dtype=torch.uint8),
             torch.zeros(0, 4, dtype=torch.uint8),
             torch.tensor([[9, 9, 10, 10]], dtype=torch.uint8)]
    samples = [(torch.zeros(1, 2, 2, dtype=torch.uint8), b) for b in boxes]
    images, (packed, index, offsets) = collate_packed(samples, capacity=4)
    assert images.shape == (3, 1, 2, 2)
    assert torch.equal(packed, torch.cat(boxes)) and packed.dtype == torch.uint8
    assert index.dtype == torch.int32 and index.tolist() == [[0, 0, 2], [0, 1, 0]]
    assert offsets.dtype == torch.int64 and offsets.tolist() == [0, 2, 2, 3]
    empty = packed_targets([torch.zeros(0, 4, dtype=torch.uint8)] * 2)
    assert [tuple(t.shape) for t in empty] == [(0, 4), (2, 0), (3,)]
    from core.errors import UserError
    with pytest.raises(UserError, match="has 2 boxes but the model predicts only 1"):
        collate_packed(samples, capacity=1)


@pytest.mark.parametrize("backend,device", KERNELS)
def test_opcheck(backend, device):
    case = make_case("random", 3, 16, torch.float32).to(device)
    targets = targets_for("packed", case)
    if backend == "triton":
        import kernels.giou.triton_packed  # noqa: F401  registers giou::triton_packed_loss
        op = torch.ops.giou.triton_packed_loss.default
    else:
        from kernels.giou.cuda_extension import load
        load()
        op = torch.ops.giou_cuda.packed_loss.default
    for requires_grad in (False, True):
        torch.library.opcheck(op, (case.pred.clone().requires_grad_(requires_grad),
                                   *targets))


@gpu
@pytest.mark.parametrize("backend", ("triton", "cuda"))
def test_gradcheck_float64(backend):
    case = make_case("random", 2, 5, torch.float64).to("cuda")
    targets = targets_for("packed", case)
    loss = losses.get("packed", backend=backend).loss
    assert torch.autograd.gradcheck(lambda p: loss(p, targets),
                                    (case.pred.clone().requires_grad_(True),),
                                    eps=1e-6, atol=1e-7)


@gpu
@pytest.mark.parametrize("backend", ("triton", "cuda"))
def test_two_launches_forward_one_backward(backend):
    """Forward: the box kernel and the finalize. Backward: one kernel writes every row."""
    case = make_case("mixed", 1024, 256, torch.bfloat16).to("cuda")
    targets = targets_for("packed", case)
    loss_fn = losses.get("packed", backend=backend).loss
    pred = case.pred.clone().requires_grad_(True)
    one = torch.ones((), device="cuda")
    loss_fn(pred, targets)  # warm-up
    out = {}
    fwd = kernels_launched(lambda: out.setdefault("loss", loss_fn(pred, targets)))
    bwd = kernels_launched(lambda: torch.autograd.grad(out["loss"], pred, grad_outputs=one))
    assert len(fwd) == 2, fwd
    assert len(bwd) == 1, bwd


@gpu
@pytest.mark.parametrize("name,backend", [("packed", "triton"), ("packed", "cuda"),
                                          ("nested", "triton"), ("compiled_packed", "triton")])
def test_no_host_device_sync_in_the_loss(name, backend):
    case = make_case("mixed", 64, 256, torch.bfloat16).to("cuda")
    targets = targets_for(name, case)
    loss_fn = losses.get(name, backend=backend).loss

    def once():
        pred = case.pred.clone().requires_grad_(True)
        torch.autograd.grad(loss_fn(pred, targets), pred)
    once()
    torch.cuda.synchronize()  # host-device sync: before the sync check starts
    torch.cuda.set_sync_debug_mode("error")
    try:
        once()
    finally:
        torch.cuda.set_sync_debug_mode("default")


@gpu
@pytest.mark.parametrize("name,backend", [("packed", "triton"), ("packed", "cuda"),
                                          ("nested", "triton")])
def test_torch_compile_over_changing_box_counts(name, backend):
    """torch.compile(fullgraph) through the ops (packed) or the jagged tensors (nested),
    over batches whose N differs: the same values as eager, and how many compiles."""
    torch._dynamo.reset()
    loss_fn = losses.get(name, backend=backend).loss
    compiled = torch.compile(loss_fn, fullgraph=True, dynamic=True)
    for _ in range(3):
        case = make_case("mixed", 16, 256, torch.bfloat16).to("cuda")
        targets = targets_for(name, case)
        results = []
        for fn in (loss_fn, compiled):
            pred = case.pred.clone().requires_grad_(True)
            try:
                loss = fn(pred, targets)
                results.append((loss, torch.autograd.grad(loss, pred)[0]))
            except Exception as exc:
                # torch 2.11's Inductor lowers no jagged layout (results/strategies.md);
                # any other error fails the test.
                if name == "nested" and "does not support layout=torch.jagged" in str(exc):
                    pytest.xfail(f"torch {torch.__version__}: Inductor does not support "
                                 "layout=torch.jagged")
                raise
        torch.testing.assert_close(results[1][0], results[0][0], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(results[1][1], results[0][1], rtol=2e-2, atol=1e-6)
