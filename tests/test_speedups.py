"""The step's speed-ups: each gives the baseline's losses and gradients, each is recorded,
--baseline turns them off, and one that cannot run here is one line and nothing written."""

import json

import pytest
import torch

import losses
import train
from core.errors import InputError
from core.names import SPEEDUPS
from data import SyntheticFaces
from model import build_model
from profiling.table import GRAPH_NOTE, format_table
from studies.compare_rows import compare_rows
from tests.helpers import TINY, cli, one_line_and_nothing_written
from training import speedups
from training.cuda_graph import copy_into

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CPU machine")


def test_baseline_turns_every_speedup_off_and_a_given_one_stays_on():
    cfg = train.parse_config(["--preset", "cpu", "--baseline", "--channels-last"])
    assert cfg.channels_last and not cfg.fused_sgd and not cfg.triton_first_block
    assert cfg.cuda_graph == "off" and not cfg.cudnn_benchmark
    default = train.parse_config(["--preset", "cpu"])
    assert default.fused_sgd and default.channels_last
    assert not default.cudnn_benchmark  # GPU only: the CPU preset leaves it off
    # Slow in Triton's interpreter: off in the CPU preset, on in the GPU preset.
    for block in ("triton_first_block", "triton_second_block", "triton_pool",
                  "triton_conv_pool", "triton_conv_pool_bwd"):
        assert not getattr(default, block) and getattr(train.Config(), block)
    assert default.cuda_graph == "off"  # measured: no gain on the GPU (results/step.md)


def _grads_after_one_step(seed: int, **switches):
    """Loss, every parameter's gradient, and the parameters after one SGD step, for the
    padded loss on the workload's data at a small size (fp32 on the CPU)."""
    used = {**{name: False for name in SPEEDUPS}, **switches}
    model, _ = build_model(32, 16, 32, False, seed, torch.device("cpu"),
                           triton_first_block=used["triton_first_block"],
                           channels_last=used["channels_last"],
                           triton_second_block=used["triton_second_block"],
                           triton_pool=used["triton_pool"],
                           triton_conv_pool=used["triton_conv_pool"],
                           triton_conv_pool_bwd=used["triton_conv_pool_bwd"])
    strategy = losses.get("padded", capacity=16)
    dataset = SyntheticFaces(100, 32, seed)
    images, targets = strategy.collate([dataset[i] for i in range(5)])
    loss = strategy.loss(model(images), targets)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    speedups.make_optimizer(model, 0.1, used).step()
    return loss.detach(), grads, [p.detach().clone() for p in model.parameters()]


@pytest.mark.parametrize("switch", ["fused_sgd", "channels_last", "triton_first_block",
                                    "triton_second_block", "triton_pool",
                                    "triton_conv_pool",
                                    "triton_conv_pool+triton_conv_pool_bwd"])
def test_each_cpu_speedup_gives_the_baselines_loss_gradients_and_update(switch):
    seed = torch.randint(0, 2**31, ()).item()
    loss0, grads0, after0 = _grads_after_one_step(seed)
    loss1, grads1, after1 = _grads_after_one_step(seed,
                                                  **dict.fromkeys(switch.split("+"), True))
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-6)
    for g1, g0 in zip(grads1, grads0, strict=True):
        assert g1.shape == g0.shape
        # Relative to the tensor's norm, not per element: another summation order can
        # flip a near-tie of a max-pool window and send one element's gradient elsewhere
        # (seen with channels_last: 5e-6 absolute on elements of 1e-3).
        assert ((g1 - g0).norm() / g0.norm()).item() < 5e-3  # worst in 80 seeds: 9.7e-4
    for p1, p0 in zip(after1, after0, strict=True):
        torch.testing.assert_close(p1, p0, rtol=1e-5, atol=1e-6)


def test_every_switch_together_gives_the_baselines_losses_step_for_step(tmp_path):
    base = train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path), "--baseline",
                                                "--run-name", "base"]))
    fast = train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path), "--cuda-graph",
                                                "auto", "--triton-first-block",
                                                "--triton-second-block", "--triton-pool",
                                                "--triton-conv-pool", "--triton-conv-pool-bwd",
                                                "--run-name", "fast"]))
    assert fast["losses"] == pytest.approx(base["losses"], rel=1e-4)
    written = json.loads((tmp_path / "fast" / "summary.json").read_text())["speedups"]
    assert written["on"] == {"cudnn_benchmark": False, "fused_sgd": True, "channels_last": True,
                             "triton_first_block": True, "triton_second_block": True,
                             "triton_pool": True, "triton_conv_pool": True,
                             "triton_conv_pool_bwd": True, "bf16_shadow": False,
                             "update_in_gemm": False, "cuda_graph": False}
    assert written["cuda_graph_off_because"] == "CUDA graphs need a CUDA GPU" or \
        torch.cuda.is_available()
    assert json.loads((tmp_path / "base" / "summary.json").read_text())["speedups"]["on"] == \
        {name: False for name in SPEEDUPS}


@CPU_ONLY
@pytest.mark.parametrize("args,message", [
    (["--cudnn-benchmark"], "--cudnn-benchmark needs a CUDA GPU"),
    (["--cuda-graph", "on"], "--cuda-graph on: CUDA graphs need a CUDA GPU"),
    (["--bf16-shadow"], "--bf16-shadow needs bf16 autocast on a CUDA GPU"),
    (["--update-in-gemm", "on"], "--update-in-gemm on: it updates --bf16-shadow's fp32 "
                                 "master weights and momentum, which need bf16 autocast"),
])
def test_a_gpu_only_speedup_without_a_gpu_is_one_line(tmp_path, args, message):
    one_line_and_nothing_written(cli("--out-dir", str(tmp_path), *args), tmp_path, message)


@pytest.mark.parametrize("args,message", [
    (["--loss", "loop", "--cuda-graph", "on"], "the loop strategy's targets are ragged"),
    (["--loss", "concat", "--cuda-graph", "on"], "the concat strategy's targets are ragged"),
    (["--loss", "packed", "--cuda-graph", "on"], "the packed strategy's targets are packed"),
    (["--loss", "nested", "--cuda-graph", "on"], "the nested strategy's targets are packed"),
    (["--mode", "forward", "--cuda-graph", "on"], "forward mode closes each phase"),
    (["--cuda-graph", "sometimes"], "argument --cuda-graph: invalid choice"),
])
def test_a_cuda_graph_where_none_can_be_made_is_one_line(tmp_path, args, message):
    one_line_and_nothing_written(cli("--out-dir", str(tmp_path), *args), tmp_path, message)


def test_auto_says_why_there_is_no_graph():
    cfg = train.parse_config(["--preset", "cpu", "--loss", "loop", "--cuda-graph", "auto"])
    used = speedups.resolve(cfg, cuda=True)
    assert used["on"]["cuda_graph"] is False
    assert "ragged" in used["cuda_graph_off_because"]
    assert "no CUDA graph: the loop strategy's targets are ragged" in \
        speedups.describe_used(used)
    cfg = train.parse_config(["--preset", "cpu", "--wait", "1", "--cuda-graph", "auto"])
    assert "--wait 2 or more" in speedups.resolve(cfg, cuda=True)["cuda_graph_off_because"]
    cfg = train.parse_config(["--preset", "cpu", "--wait", "2", "--cuda-graph", "auto"])
    assert speedups.resolve(cfg, cuda=True)["on"]["cuda_graph"] is True


def test_the_third_blocks_triton_backward_is_off_without_its_forward():
    """It reads the fused forward's code: with the forward off it cannot run, and the run
    says it did not."""
    on = speedups.resolve(train.Config(triton_conv_pool=False), cuda=True)["on"]
    assert on["triton_conv_pool_bwd"] is False and on["triton_pool"] is True
    assert speedups.resolve(train.Config(), cuda=True)["on"]["triton_conv_pool_bwd"] is True


def test_one_process_keeps_one_cudnn_choice_when_it_measures_many_runs(monkeypatch):
    monkeypatch.setattr(speedups, "_cudnn_choice", [])
    before = torch.backends.cudnn.benchmark
    try:
        speedups.apply_backend_flags({"cudnn_benchmark": False}, cuda=True, many_runs=True)
        speedups.apply_backend_flags({"cudnn_benchmark": False}, cuda=True, many_runs=True)
        with pytest.raises(train.UserError, match="must start in a new process"):
            speedups.apply_backend_flags({"cudnn_benchmark": True}, cuda=True, many_runs=True)
        # A single run (train.py, the tests) is not held to it.
        speedups.apply_backend_flags({"cudnn_benchmark": True}, cuda=True, many_runs=False)
    finally:
        torch.backends.cudnn.benchmark = before


def test_a_graph_replays_fixed_shapes_only():
    static = (torch.zeros(2, 1, 4, 4), (torch.zeros(2, 3, 4), torch.zeros(2)))
    fresh = (torch.ones(2, 1, 4, 4), (torch.ones(2, 3, 4), torch.full((2,), 7.0)))
    copy_into(static, fresh)
    assert static[0].sum() == 32 and static[1][1].tolist() == [7.0, 7.0]
    with pytest.raises(InputError, match="a CUDA graph replays fixed shapes"):
        copy_into(static, (torch.ones(3, 1, 4, 4), fresh[1]))


def _graph_summary():
    phase = {"cpu_ms": 1.0, "cpu_ms_each": [1.0], "gpu_ms": 2.0, "launches": 1.0,
             "h2d_copies": 0.0, "syncs": 0.0}
    return {"steps": 1, "phases": {"data": phase, "copy": phase, "graph": phase},
            "step": {"cpu_ms": 3.0, "cpu_ms_each": [3.0], "gpu_ms": 6.0},
            "config": {"loss": "padded", "backend": "triton", "mode": "train"},
            "speedups": {"on": {"cuda_graph": True}}, "peak_gpu_memory_gb": 1.0}


def test_a_graph_runs_table_says_why_the_phases_are_one_row():
    summary = _graph_summary()
    assert GRAPH_NOTE in format_table(summary, "t", on_gpu=True)
    data_only = {**summary, "phases": {"data": summary["phases"]["data"]}}
    assert GRAPH_NOTE not in format_table(data_only, "t", on_gpu=True)


def test_a_graph_run_in_a_comparison_has_no_loss_columns_but_its_step():
    (row,) = compare_rows([_graph_summary()])
    assert row["loss launches"] is None and row["graph GPU ms"] == 2.0
    assert row["step GPU ms"] == 6.0 and row["CUDA graph"] == "yes"

