"""GPU-only checks (make test-gpu on the device): short profiled runs of every strategy,
no host-device sync inside the loss, torch.compile over the fused ops, gradcheck, and the
launch counts the fused kernels promise."""

import pytest
import torch

import losses
import train
from kernels.giou import giou_loss
from profiling import flops
from tests.cases import make_case
from tests.helpers import SMALL, kernels_launched

pytestmark = pytest.mark.gpu
FUSED = [("triton", False), ("triton", True), ("cuda", False), ("cuda", True)]


@pytest.mark.parametrize("loss,kernel", [("loop", "triton"), ("concat", "triton"),
                                         ("padded", "triton"), ("compiled", "triton"),
                                         ("kernel", "triton"),
                                         ("conditional", "triton"), ("kernel", "cuda"),
                                         ("conditional", "cuda"), ("packed", "triton"),
                                         ("packed", "cuda"), ("nested", "triton"),
                                         ("compiled_packed", "triton")])
@pytest.mark.parametrize("mode", ("train", "forward"))
def test_short_profile_run(tmp_path, loss, kernel, mode):
    record = train.run(train.parse_config(SMALL + ["--loss", loss, "--backend", kernel,
                                                   "--mode", mode, "--out-dir", str(tmp_path)]))
    phases = record["phases"]
    for name in ("forward", "loss") + (("loss_backward", "backward", "optimizer")
                                       if mode == "train" else ()):
        assert phases[name]["gpu_ms"] > 0, name
        assert phases[name]["cpu_ms"] > 0, name
    assert phases["copy"]["h2d_copies"] >= 1
    if mode == "forward":  # the original's method: a sync closes each range
        assert phases["loss"]["syncs"] >= 1
    else:
        assert phases["loss"]["syncs"] == 0


def test_compiled_model_profile_run(tmp_path):
    """And the run's account of it (profiling/compile_account.py, on this torch) and of
    its FLOPs (profiling/flops.py): graphs compiled in the first steps, --torch-trace's
    log written, an MFU on a GPU whose peak is known."""
    trace = tmp_path / "tlparse-in"
    args = [a for a in SMALL if a != "--no-compile"] + [
        "--compile", "--out-dir", str(tmp_path / "runs"), "--torch-trace", str(trace)]
    record = train.run(train.parse_config(args))
    assert record["phases"]["forward"]["gpu_ms"] > 0
    compiled = record["compile"]
    assert compiled["graphs"] >= 1 and 0 < compiled["compile_s"] * 1e3 <= \
        compiled["first_steps_ms"], compiled
    assert any(trace.iterdir())
    model = record["flops"]
    assert model["tflop"] > 0 and model["tflop_per_s"] > 0
    if flops.peak_of(torch.cuda.get_device_name()) is not None:
        assert 0 < model["mfu"] < 1 and 0 < model["sustained_mfu"] < 1, model
        assert "MFU " in record["table"]


def _grad_once(loss_fn, case):
    pred = case.pred.clone().requires_grad_(True)
    loss = loss_fn(pred)
    (grad,) = torch.autograd.grad(loss, pred)
    return loss, grad


@pytest.mark.parametrize("name,kernel", [("padded", "triton"), ("compiled", "triton"),
                                         ("kernel", "triton"), ("conditional", "triton"),
                                         ("kernel", "cuda"), ("conditional", "cuda")])
def test_no_host_device_sync_in_the_loss(name, kernel):
    case = make_case("mixed", 64, 256, torch.bfloat16).to("cuda")
    strategy = losses.get(name, backend=kernel)
    targets = (case.boxes, case.counts)
    fn = lambda p: strategy.loss(p, targets)
    _grad_once(fn, case)  # warm-up: compiles and loads kernels outside the check
    torch.cuda.synchronize()  # host-device sync: before the sync check starts
    torch.cuda.set_sync_debug_mode("error")
    try:
        _grad_once(fn, case)
    finally:
        torch.cuda.set_sync_debug_mode("default")


@pytest.mark.parametrize("name,kernel", [("padded", "triton"), ("kernel", "triton"),
                                         ("conditional", "triton"), ("kernel", "cuda"),
                                         ("conditional", "cuda")])
def test_torch_compile_fullgraph(name, kernel):
    torch._dynamo.reset()
    case = make_case("mixed", 16, 256, torch.bfloat16).to("cuda")
    strategy = losses.get(name, backend=kernel)
    targets = (case.boxes, case.counts)
    eager = _grad_once(lambda p: strategy.loss(p, targets), case)
    compiled_loss = torch.compile(strategy.loss, fullgraph=True)
    compiled = _grad_once(lambda p: compiled_loss(p, targets), case)
    torch.testing.assert_close(compiled[0], eager[0], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(compiled[1], eager[1], rtol=2e-2, atol=1e-6)


@pytest.mark.parametrize("backend,conditional", FUSED)
def test_gradcheck_float64(backend, conditional):
    case = make_case("random", 2, 5, torch.float64).to("cuda")
    fn = lambda p: giou_loss(p, case.boxes, case.counts, backend, conditional)
    assert torch.autograd.gradcheck(fn, (case.pred.clone().requires_grad_(True),),
                                    eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("backend,conditional", FUSED)
def test_two_launches_forward_one_backward(backend, conditional):
    case = make_case("mixed", 1024, 256, torch.bfloat16).to("cuda")
    pred = case.pred.clone().requires_grad_(True)
    one = torch.ones((), device="cuda")
    giou_loss(pred, case.boxes, case.counts, backend, conditional)  # warm-up
    out = {}
    fwd = kernels_launched(lambda: out.setdefault(
        "loss", giou_loss(pred, case.boxes, case.counts, backend, conditional)))
    bwd = kernels_launched(lambda: torch.autograd.grad(out["loss"], pred, grad_outputs=one))
    assert len(fwd) == 2, fwd
    assert len(bwd) == 1, bwd
