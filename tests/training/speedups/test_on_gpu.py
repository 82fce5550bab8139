"""GPU-only checks of the step's speed-ups (make test-gpu): each keeps the baseline's losses
over a few steps at a small size, and a CUDA graph replays the eager step exactly, with no
host-device sync, and shows in the profile as one range."""

import json
import subprocess
import sys

import pytest
import torch

import losses
import train
from core.errors import InputError
from data import SyntheticFaces
from model.boxnet import BoxNet
from tests.cases import KINDS, make_case
from tests.helpers import REPO, SMALL, with_what_it_needs
from training import speedups
from training.cuda_graph import GraphedLoss, GraphedStep

pytestmark = pytest.mark.gpu
GRAPH_STEPS = ["--wait", "2", "--warmup", "1", "--active", "3"]
STATIC = [("padded", "triton"), ("compiled", "triton"), ("kernel", "triton"),
          ("conditional", "triton"), ("kernel", "cuda"), ("conditional", "cuda")]


def _losses(tmp_path, *args):
    return train.run(train.parse_config(SMALL + ["--out-dir", str(tmp_path), *args]))


@pytest.mark.parametrize("loss,backend", STATIC)
def test_a_cuda_graph_replays_the_eager_steps_losses(tmp_path, loss, backend):
    common = ["--loss", loss, "--backend", backend, *GRAPH_STEPS]
    eager = _losses(tmp_path, *common, "--cuda-graph", "off")
    graph = _losses(tmp_path, *common, "--cuda-graph", "on")
    assert graph["speedups"]["on"]["cuda_graph"] and not eager["speedups"]["on"]["cuda_graph"]
    assert graph["losses"] == pytest.approx(eager["losses"], rel=1e-3)
    phases = graph["phases"]
    assert set(phases) == {"data", "copy", "graph"}
    assert phases["graph"]["launches"] == 1 and phases["graph"]["gpu_ms"] > 0
    assert phases["copy"]["h2d_copies"] >= 2 and phases["graph"]["syncs"] == 0
    assert "CUDA graph:" in graph["table"]


def _pinned(batch):
    images, (boxes, counts) = batch
    return images.pin_memory(), (boxes.pin_memory(), counts.pin_memory())


def _small_step(seed):
    torch.manual_seed(seed)
    model = BoxNet(64, 16, 64).cuda()
    strategy = losses.get("padded", capacity=16)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-2, momentum=0.9, fused=True)

    def step_fn(images, targets):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            pred = model(images)
        loss = strategy.loss(pred, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return loss

    def to_device(batch):
        images, targets = batch
        return images.cuda(non_blocking=True), strategy.to_device(targets, "cuda")

    dataset = SyntheticFaces(100, 64, seed)
    batches = [_pinned(strategy.collate([dataset[i] for i in range(4 * k, 4 * k + 4)]))
               for k in range(5)]
    return step_fn, to_device, batches


def test_a_graph_replay_never_syncs_and_matches_the_eager_step():
    seed = torch.randint(0, 2**31, ()).item()
    step_fn, to_device, batches = _small_step(seed)
    eager = [step_fn(*to_device(b)).item() for b in batches]
    step_fn, to_device, batches = _small_step(seed)
    graphed = GraphedStep(step_fn, to_device, capture_at=1)
    replayed = []
    for i, (images, targets) in enumerate(batches):
        if i > graphed.capture_at:  # the replays, and their copies, under the sync check
            torch.cuda.set_sync_debug_mode("error")
        try:
            loss = graphed.step(i, images, targets)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        replayed.append(loss.item())  # host-device sync: outside the check, as in train.py
        del loss  # as train.py: an eager step's graph must not outlive its step
    assert replayed == pytest.approx(eager, rel=1e-4)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_the_graphed_loss_is_the_eager_loss_bit_for_bit_with_no_sync(dtype):
    """Fresh cases of every kind (zero boxes and all 256 in a batch) through one graph:
    each replay's loss and gradient are the eager padded loss's bit for bit, with no
    host-device sync; another shape or dtype is one error."""
    padded = losses.get("padded", capacity=256)
    graphed = GraphedLoss(padded.loss)
    one = torch.ones((), device="cuda")
    for i, kind in enumerate(KINDS * 2):
        case = make_case(kind, B=6, M=256, dtype=dtype).to("cuda")
        pred, targets = case.pred.requires_grad_(), (case.boxes, case.counts)
        loss = padded.loss(pred, targets)
        (grad,) = torch.autograd.grad(loss, pred, grad_outputs=one)
        if i:  # the first call captures (a sync, once); the replays must not sync
            torch.cuda.set_sync_debug_mode("error")
        try:
            replayed = graphed(pred, targets)
            (replayed_grad,) = torch.autograd.grad(replayed, pred, grad_outputs=one)
        finally:
            torch.cuda.set_sync_debug_mode("default")
        assert torch.equal(replayed, loss) and torch.equal(replayed_grad, grad), case.seed
    with pytest.raises(InputError, match="fixed shapes"):
        graphed(pred[:, :128], (case.boxes[:, :128], case.counts))
    other = torch.float64 if dtype != torch.float64 else torch.float32
    with pytest.raises(InputError, match="fixed dtypes"):
        graphed(pred.to(other), targets)


def test_the_graphed_loss_keeps_the_steps_losses_in_a_few_launches(tmp_path):
    eager = _losses(tmp_path, "--loss", "padded", "--graphed-loss", "off", "--active", "3")
    graph = _losses(tmp_path, "--loss", "padded", "--graphed-loss", "on", "--active", "3")
    assert graph["speedups"]["on"]["graphed_loss"]
    assert not eager["speedups"]["on"]["graphed_loss"]
    assert graph["losses"] == pytest.approx(eager["losses"], rel=1e-5)
    launches = {run: sum(p["phases"][k]["launches"] for k in ("loss", "loss_backward"))
                for run, p in (("eager", eager), ("graph", graph))}
    # The copies in, one graph, the loss's clone; one multiply in the backward.
    assert launches["graph"] <= 8 < 40 <= launches["eager"], launches
    assert graph["phases"]["loss"]["syncs"] == 0


# Every switch of the model or optimizer that keeps the maths; cuDNN's autotuning, the
# update in the GEMM, the CUDA graph and float8 (test_float8_lin1.py) have tests of their
# own.
SWITCHES = [s.name for s in speedups.SPEEDUPS
            if not s.choice and (s.model or s.optimizer) and not s.changes_maths]


@pytest.mark.parametrize("name", SWITCHES)
def test_each_speedup_keeps_the_baselines_losses_on_the_gpu(tmp_path, name):
    base = _losses(tmp_path, "--baseline", "--active", "4")
    needs = with_what_it_needs(name, lambda s: s.model or s.optimizer)
    # A choice among them (the update beside the trunk, before split_master) takes "on".
    flags = [a for n in needs for a in (speedups.BY_NAME[n].flag,
                                        *(["on"] if speedups.BY_NAME[n].choice else []))]
    fast = _losses(tmp_path, "--baseline", *flags, "--active", "4")
    assert fast["speedups"]["on"][name]
    # bf16 autocast: other convolution algorithms round differently.
    assert fast["losses"] == pytest.approx(base["losses"], rel=1e-2)


def test_cudnn_autotuning_keeps_the_losses(tmp_path):
    """In two processes: cuDNN keeps a process's first choice of algorithm."""
    out = []
    for extra in ([], ["--cudnn-benchmark"]):
        name = f"run{len(out)}"
        subprocess.run([sys.executable, str(REPO / "train.py"), *SMALL, "--baseline", *extra,
                        "--out-dir", str(tmp_path), "--run-name", name], check=True,
                       cwd=REPO, capture_output=True, timeout=600)
        out.append(json.loads((tmp_path / name / "summary.json").read_text()))
    assert out[1]["speedups"]["on"]["cudnn_benchmark"]
    assert out[1]["losses"] == pytest.approx(out[0]["losses"], rel=1e-2)
