"""make profile GPUS=N on every GPU of the machine (make test-gpu on a machine with two or
more): NCCL ranks train as one GPU on the global batch, and the summary holds each rank's
NCCL time."""

import json
import subprocess
import sys

import pytest
import torch

import train
from tests.helpers import REPO, SMALL

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two GPUs (nvidia-h200-x2)")]
# Every GPU the machine has: two on nvidia-h200-x2, four or eight where those are lent.
GPUS = torch.cuda.device_count()
PER_RANK = ["--batch-size", "32", "--active", "3"]
GLOBAL_BATCH = ["--batch-size", str(32 * GPUS)]
LAUNCH = [sys.executable, "-m", "training.launch", "--nproc", str(GPUS), "train.py"]


@pytest.mark.parametrize("loss,backend", [("padded", "triton"), ("kernel", "cuda")])
def test_the_gpus_train_as_one_on_the_global_batch(tmp_path, loss, backend):
    common = ["--loss", loss, "--backend", backend, "--out-dir", str(tmp_path)]
    done = subprocess.run([*LAUNCH, *SMALL, *PER_RANK, *common, "--run-name", "job"], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    job = json.loads((tmp_path / "job" / "summary.json").read_text())
    one = train.run(train.parse_config(SMALL + PER_RANK + common + GLOBAL_BATCH))
    # bf16 autocast: the two GEMM shapes round differently; the losses agree to bf16.
    assert job["losses"] == pytest.approx(one["losses"], rel=1e-2)
    ranks = job["distributed"]
    assert ranks["backend"] == "nccl" and ranks["world"] == GPUS
    for rank in ranks["ranks"]:
        comm = rank["communication"]
        assert comm["gpu"] and comm["comm_ms"] > 0 and comm["collectives"] >= 2
        assert comm["by_phase_ms"]["backward"] > 0  # DDP's all-reduces, in the backward
        assert comm["overlapped_ms"] + comm["exposed_ms"] == pytest.approx(comm["comm_ms"])
    assert job["environment"]["device"] == torch.cuda.get_device_name(0)


@pytest.mark.parametrize("parallel", ["zero", "tp", "tp2d"])
@pytest.mark.parametrize("loss,backend", [("padded", "triton"), ("kernel", "cuda"),
                                          ("conditional", "triton"), ("packed", "cuda")])
def test_every_design_on_the_gpus_trains_as_one(tmp_path, parallel, loss, backend):
    """--parallel zero, tp and tp2d (on one host: tp on a 2-D mesh of one row) with NCCL,
    the bf16 shadow on each rank's rows of lin1 and the compiled trunk: the losses of one
    GPU on the global batch, within bf16 rounding."""
    common = ["--loss", loss, "--backend", backend, "--out-dir", str(tmp_path)]
    done = subprocess.run([*LAUNCH, *SMALL, *PER_RANK, *common, "--parallel", parallel,
                           "--run-name", "job"], cwd=REPO, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    job = json.loads((tmp_path / "job" / "summary.json").read_text())
    one = train.run(train.parse_config(SMALL + PER_RANK + common + GLOBAL_BATCH))
    assert job["losses"] == pytest.approx(one["losses"], rel=1e-2)
    assert job["distributed"]["parallel"] == parallel


@pytest.mark.parametrize("speedup", ["graphed_head", "sms_for_collectives",
                                     "copy_engine_collectives"])
def test_tp_speedups_give_the_plain_heads_losses(tmp_path, speedup):
    """A tp speed-up on against off: --graphed-head replays the eager head's kernels and
    collectives (bit for bit in test_graphed_head.py); --sms-for-collectives runs the same
    GEMMs with SMs left to NCCL; --copy-engine-collectives the same sums by copy engine,
    inside the graphed head (training/speedups/*.py say why)."""
    common = ["--loss", "kernel", "--backend", "cuda", "--parallel", "tp",
              "--out-dir", str(tmp_path)]
    if speedup != "copy_engine_collectives":  # on by default on two GPUs, it idles the carveout
        common += ["--copy-engine-collectives", "off"]
    runs = {}
    for choice in ("off", "on"):
        done = subprocess.run([*LAUNCH, *SMALL, *PER_RANK, *common,
                               "--" + speedup.replace("_", "-"), choice,
                               "--run-name", choice], cwd=REPO, capture_output=True,
                              text=True, timeout=600)
        assert done.returncode == 0, done.stderr[-3000:]
        runs[choice] = json.loads((tmp_path / choice / "summary.json").read_text())
    assert runs["on"]["speedups"]["on"][speedup]
    assert not runs["off"]["speedups"]["on"][speedup]
    # cuDNN may tune the trunk's convolutions apart in the two jobs: bf16's places.
    assert runs["on"]["losses"] == pytest.approx(runs["off"]["losses"], rel=1e-3)


def test_make_throughput_and_make_scaling_on_the_gpus_at_a_small_size(tmp_path):
    """make throughput GPUS=N against one GPU's table, and make scaling GPUS=N: both
    tables written by rank 0, with a scaling and every design's row."""
    small = [*SMALL, *PER_RANK, "--steps", "12", "--wait", "4", "--num-workers", "2"]

    def command(module, *args, nproc=1):
        launch = ["-m", "training.launch", "--nproc", str(nproc)] if nproc > 1 else []
        done = subprocess.run([sys.executable, *launch, "-m", module, *args, *small],
                              cwd=REPO, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, done.stderr[-3000:]
    command("studies.throughput", "--strategies", "padded", "--out", str(tmp_path / "one"))
    command("studies.throughput", "--strategies", "padded", "--out", str(tmp_path / "many"),
            "--against", str(tmp_path / "one"), nproc=GPUS)
    table = (tmp_path / "many" / "throughput.md").read_text()
    assert "| scaling |" in table and "x |" in table, table
    command("studies.scaling", "--out", str(tmp_path / "sc"), nproc=GPUS)
    scaling = (tmp_path / "sc" / "scaling.md").read_text()
    assert all(f"| {design} | {GPUS} |" in scaling for design in ("ddp", "zero", "tp", "tp2d"))

