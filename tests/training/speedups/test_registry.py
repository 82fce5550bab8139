"""The step's speed-ups as a registry (training/speedups/): every one, as the registry
lists it, gives the baseline's losses and gradients, keeps the model's parameter names and
values, is a flag of train.py, is recorded, and refuses in one line where it cannot apply;
--baseline turns them all off."""

import dataclasses
import json
import re
from pathlib import Path

import pytest
import torch

import losses
import train
from core.errors import InputError, UserError
from data import SyntheticFaces
from model.boxnet import BoxNet
from profiling.table import GRAPH_NOTE, format_table
from studies.compare_rows import compare_rows
from tests.helpers import (
    TINY,
    cli,
    model_with,
    one_line_and_nothing_written,
    resolved,
    with_what_it_needs,
)
from tests.reference import nearest_pool_decision
from training import speedups
from training.cuda_graph import copy_into
from training.speedups import cudnn_benchmark
from training.speedups.base import Build

CPU_ONLY = pytest.mark.skipif(torch.cuda.is_available(), reason="tests the CPU machine")
CPU = ["--preset", "cpu"]


def _asking_for(spec) -> list[str]:
    """The flags that ask for a speed-up: --name, or --name on for a choice."""
    return [spec.flag, "on"] if spec.choice else [spec.flag]


def _alone(name: str) -> train.Config:
    """The CPU preset's config with that speed-up alone asked for."""
    return train.parse_config(CPU + ["--baseline"] + _asking_for(speedups.BY_NAME[name]))


def test_every_module_of_the_package_is_in_the_ladders_order_and_a_flag():
    package = Path(speedups.__file__).parent
    modules = {p.stem for p in package.glob("*.py")} - {"__init__", "base"}
    assert modules == set(speedups.ORDER)
    fields = [f.name for f in dataclasses.fields(train.Config)]
    start = fields.index("baseline") + 1
    assert tuple(fields[start:start + len(speedups.ORDER)]) == speedups.ORDER
    for spec in speedups.SPEEDUPS:
        given = train.given_options(_asking_for(spec))
        assert given[spec.name] == ("on" if spec.choice else True)
        if not spec.choice:
            assert train.given_options([f"--no-{spec.flag[2:]}"])[spec.name] is False


def test_a_speedup_that_changes_the_maths_is_off_by_default_and_after_every_other():
    """The default step and the ladder's rungs before it keep the baseline's maths."""
    changing = [s for s in speedups.SPEEDUPS if s.changes_maths]
    assert all(s.default in (False, "off") for s in changing)
    assert list(speedups.ORDER[len(speedups.ORDER) - len(changing):]) == \
        [s.name for s in changing]
    assert speedups.maths_changed(resolved(train.Config(), cuda=True)["on"]) == "same"


def test_baseline_turns_every_speedup_off_and_a_given_one_stays_on():
    cfg = train.parse_config(CPU + ["--baseline", "--channels-last"])
    assert cfg.channels_last
    assert all(getattr(cfg, n) in (False, "off") for n in speedups.ORDER if n != "channels_last")
    default = train.parse_config(CPU)
    gpu = train.Config()
    for spec in speedups.SPEEDUPS:
        assert getattr(gpu, spec.name) == spec.default
        # Off in the CPU preset: what needs a GPU, and the interpreter's slow kernels.
        off_here = not spec.choice and (spec.gpu_only or spec.interpreter_slow)
        assert getattr(default, spec.name) == (False if off_here else spec.default)
    assert default.fused_sgd and default.channels_last and default.cuda_graph == "off"


def _batch(seed: int):
    """(padded strategy, images, targets): five of the workload's images at 32x32."""
    strategy = losses.get("padded", capacity=16)
    dataset = SyntheticFaces(100, 32, seed)
    return strategy, *strategy.collate([dataset[i] for i in range(5)])


def _after_one_step(seed: int, names: set):
    """Loss, every parameter's gradient, and the parameters after one SGD step, for the
    padded loss on the workload's data at a small size (fp32 on the CPU)."""
    model, optimizer = model_with(names, 32, 16, 32, seed)
    strategy, images, targets = _batch(seed)
    loss = strategy.loss(model(images), targets)
    loss.backward()
    grads = [p.grad.clone() for p in model.parameters()]
    optimizer.step()
    return loss.detach(), grads, [p.detach().clone() for p in model.parameters()]


def _baseline_update(seed: int, grads: list) -> list:
    """The parameters after the baseline's SGD step (no speed-up) from `grads`."""
    model, optimizer = model_with(set(), 32, 16, 32, seed)
    for p, g in zip(model.parameters(), grads, strict=True):
        p.grad = g.contiguous()
    optimizer.step()
    return [p.detach().clone() for p in model.parameters()]


# A speed-up sums in another order than the baseline, so their fp32 values differ by about
# fp32's own error. Where a pool window's two largest values, a pool's max and 0 (the ReLU
# after it) or lin1's output and 0 lie closer than that, the two may decide differently and
# send one gradient to another pixel: a CI's draw moved the first conv's dL/dweight by
# 0.8 % (seed 1816761166 moves it 2 %: a window's two largest 3.4e-8 apart in float64,
# fp32's error in that layer 1.5e-7). Such draws are drawn again, as in
# tests/kernels/trunk/test_first_block.py. Exact ties stay: equal inputs, equal values.
NEAR = 4  # a decision within 4x the baseline's largest fp32 error (vs float64) of its layer


def _nearest_decision(seed: int) -> float:
    """How near the baseline's forward comes to a decision, in units of its layer's fp32
    error: the least, over the four pools' windows and lin1's ReLU, of (gap to the
    window's max, or |value| at a ReLU) / (the layer's largest |fp32 - float64|)."""
    import torch.nn.functional as F
    model, _ = model_with(set(), 32, 16, 32, seed)
    _, images, _ = _batch(seed)
    x32, x64, nearest = model.pixels(images), images.double() / 255, float("inf")

    def near(gaps, err):  # err 0: fp32 exact, so no gap is too near
        gap = gaps[gaps > 0].min().item() if (gaps > 0).any() else float("inf")
        return gap / err if err > 0 else float("inf")

    with torch.no_grad():
        for block in model.features:
            conv = block[0]
            v32 = conv(x32)
            v64 = F.conv2d(x64, conv.weight.double(), conv.bias.double(), padding="same")
            err = (v32.double() - v64).abs().max().item()
            if err > 0:  # 0: fp32 exact, so no decision is too near
                nearest = min(nearest, nearest_pool_decision(v64) / err)
            x32, x64 = block(x32), torch.relu(F.max_pool2d(v64, 2))
        h32 = model.lin1(x32.flatten(1))
        h64 = F.linear(x64.flatten(1), model.lin1.weight.double(), model.lin1.bias.double())
        return min(nearest, near(h64.abs(), (h32.double() - h64).abs().max().item()))


def _decisive_seed() -> int:
    """A fresh seed whose baseline forward decides nowhere within NEAR (about 1 draw in 3
    does not)."""
    for _ in range(100):
        seed = torch.randint(0, 2**31, ()).item()
        if _nearest_decision(seed) >= NEAR:
            return seed
    raise AssertionError("100 draws, each with a near decision")


def test_a_draw_with_a_near_tie_is_drawn_again():
    """The check itself: the CI's draw, whose first pool holds a near tie, does not pass."""
    assert _nearest_decision(1816761166) < 1


def _runs_here(spec) -> bool:
    """A speed-up of the model or optimizer that a CPU run without autocast can use."""
    return (spec.model or spec.optimizer) and not spec.gpu_only and not spec.refusal


@pytest.mark.parametrize("name", [s.name for s in speedups.SPEEDUPS if _runs_here(s)])
def test_each_speedup_that_runs_here_gives_the_baselines_loss_gradients_and_update(name):
    _gives_the_baselines_step(name, _decisive_seed())


def test_a_batch_without_boxes_gives_zero_gradients_both_ways():
    """Seed 815107497's five images hold no box: a zero loss and zero gradients."""
    assert all(t.sum() == 0 for t in _batch(815107497)[2][1:])
    _gives_the_baselines_step("channels_last", 815107497)


def _gives_the_baselines_step(name: str, seed: int) -> None:
    """The speed-up `name` (and what it needs) against the baseline: the loss, every
    gradient, and the update on its own gradients."""
    def with_seed(message: str) -> str:  # a failing draw can be run again
        return f"{message} (seed {seed})"

    loss0, grads0, _ = _after_one_step(seed, set())
    loss1, grads1, after1 = _after_one_step(seed, set(with_what_it_needs(name, _runs_here)))
    torch.testing.assert_close(loss1, loss0, rtol=1e-5, atol=1e-6, msg=with_seed)
    for g1, g0 in zip(grads1, grads0, strict=True):
        assert g1.shape == g0.shape
        # Relative to the tensor's norm, not per element (another summation order moves a
        # near-zero element by more than its size), and as a product: five images without
        # a box (1 draw in 720: 26.8 % of images hold none) give a zero loss, whose
        # gradients must stay zero.
        # Each speed-up's worst in 8 decisive draws: 2.3e-6 (a near tie's flip: 7.7e-3).
        assert (g1 - g0).norm() <= 5e-3 * g0.norm(), f"seed {seed}"
    # The update, element by element: the speed-up's step against the baseline's SGD on the
    # speed-up's own gradients. Against the baseline's own step, a near-tie flipped above
    # moved one weight by lr x that gradient (a CI: 2e-6 on a conv weight, channels_last).
    for p1, p0 in zip(after1, _baseline_update(seed, grads1), strict=True):
        torch.testing.assert_close(p1, p0, rtol=1e-5, atol=1e-6, msg=with_seed)


@pytest.mark.parametrize("name", [s.name for s in speedups.SPEEDUPS if s.model])
def test_each_model_speedup_keeps_the_parameters_names_and_values(name):
    """Applied alone to the plain model built from the same seed: the same parameter names
    in the same order, the same values (bf16_shadow's weight: the plain one rounded to
    bf16, its fp32 master the plain one exactly)."""
    seed = torch.randint(0, 2**31, ()).item()
    torch.manual_seed(seed)
    plain = dict(BoxNet(32, 16, 32).named_parameters())
    model, _ = model_with({name}, 32, 16, 32, seed)
    changed = dict(model.named_parameters())
    assert list(changed) == list(plain)
    for key, p in changed.items():
        assert torch.equal(p.detach(), plain[key].detach().to(p.dtype)), key
    for key, buffer in model.named_buffers():
        assert key == "lin1_master" and torch.equal(buffer, plain["lin1.weight"].detach())


@CPU_ONLY
@pytest.mark.parametrize("name", [s.name for s in speedups.SPEEDUPS
                                  if s.gpu_only or s.refusal])
def test_each_speedup_asked_for_where_it_cannot_apply_is_one_line(tmp_path, name):
    """Here, a CPU without autocast: one line naming the flag, exit 2, nothing written."""
    spec = speedups.BY_NAME[name]
    reason = spec.why_not(train.asked_of(_alone(name)), cuda=False)
    assert reason
    line = f"{spec.flag} on: {reason}" if spec.choice else f"{spec.flag} {reason}"
    one_line_and_nothing_written(cli("--out-dir", str(tmp_path), *_asking_for(spec)),
                                 tmp_path, line)
    with pytest.raises(UserError, match=re.escape(line)):
        speedups.check(train.asked_of(_alone(name)), cuda=False)


def test_every_switch_together_gives_the_baselines_losses_step_for_step(tmp_path):
    """Every speed-up a CPU can run, on together (a choice at auto), from the registry: a
    new one is in this test by being in ORDER."""
    if torch.cuda.is_available():
        pytest.skip("the CPU's set: a GPU turns the GPU-only ones on")
    flags = [arg for s in speedups.SPEEDUPS if not s.gpu_only or s.choice
             for arg in ([s.flag, "auto"] if s.choice else [s.flag])]
    base = train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path), "--baseline",
                                                "--run-name", "base"]))
    fast = train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path), *flags,
                                                "--run-name", "fast"]))
    assert fast["losses"] == pytest.approx(base["losses"], rel=1e-4)
    written = json.loads((tmp_path / "fast" / "summary.json").read_text())["speedups"]
    assert written["on"] == {s.name: not s.gpu_only for s in speedups.SPEEDUPS}
    assert sum(written["on"].values()) >= 8  # fused_sgd, channels_last, the Triton kernels
    assert written["cuda_graph_off_because"] == "CUDA graphs need a CUDA GPU"
    assert json.loads((tmp_path / "base" / "summary.json").read_text())["speedups"]["on"] == \
        {name: False for name in speedups.ORDER}


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


def test_one_rank_is_not_told_why_a_several_rank_speedup_is_off():
    """tp's graphed head is off on every one-GPU run: its reason would be noise there."""
    used = resolved(train.parse_config(CPU), cuda=True)
    several = [s.name for s in speedups.SPEEDUPS if s.several_ranks]
    assert several and all(used[f"{name}_off_because"] for name in several)
    for name in several:
        assert f"no {name}:" not in speedups.describe_used(used, world=1)
        # A speed-up turned off is off for no reason worth a line.
        said = used[f"{name}_off_because"] != "turned off"
        assert (f"no {name}:" in speedups.describe_used(used, world=2)) == said
    assert any(used[f"{name}_off_because"] != "turned off" for name in several)


def test_auto_says_why_there_is_no_graph():
    cfg = train.parse_config(CPU + ["--loss", "loop", "--cuda-graph", "auto"])
    used = resolved(cfg, cuda=True)
    assert used["on"]["cuda_graph"] is False
    assert "ragged" in used["cuda_graph_off_because"]
    assert "no cuda_graph: the loop strategy's targets are ragged" in \
        speedups.describe_used(used)
    cfg = train.parse_config(CPU + ["--wait", "1", "--cuda-graph", "auto"])
    assert "--wait 2 or more" in resolved(cfg, cuda=True)["cuda_graph_off_because"]
    cfg = train.parse_config(CPU + ["--wait", "2", "--cuda-graph", "auto"])
    assert resolved(cfg, cuda=True)["on"]["cuda_graph"] is True


def _graphed_loss(*args, cuda=True):
    used = resolved(train.parse_config(CPU + list(args)), cuda=cuda)
    return used["on"]["graphed_loss"], used["graphed_loss_off_because"]


def test_the_graphed_loss_is_padded_alone_in_train_mode_on_a_gpu():
    assert _graphed_loss("--loss", "padded") == (True, None)
    for loss in ("loop", "concat", "packed", "nested", "compiled_packed"):
        assert "change shape every batch" in _graphed_loss("--loss", loss)[1]
    for loss in ("kernel", "conditional", "compiled"):
        assert f"the {loss} strategy's is a few fused ones" in _graphed_loss("--loss", loss)[1]
    assert "forward mode" in _graphed_loss("--mode", "forward")[1]
    assert "--wait 1 or more" in _graphed_loss("--wait", "0")[1]
    assert _graphed_loss(cuda=False) == (False, "CUDA graphs need a CUDA GPU")
    assert _graphed_loss("--graphed-loss", "off") == (False, "turned off")
    # Inside the whole step's graph it has nothing left to do.
    whole = _graphed_loss("--cuda-graph", "on", "--lin1-update-beside-trunk", "off", "--wait",
                          "2")
    assert whole == (False, "the whole step is one CUDA graph (--cuda-graph)")


def test_a_graphed_loss_asked_for_another_strategy_is_one_line(tmp_path):
    one_line_and_nothing_written(cli("--out-dir", str(tmp_path), "--loss", "kernel",
                                     "--graphed-loss", "on"), tmp_path,
                                 "--graphed-loss on: only padded's loss is many small")


def test_the_third_blocks_triton_backward_is_off_without_its_forward():
    """It reads the fused forward's code: with the forward off it cannot run, and the run
    says it did not."""
    on = resolved(train.Config(triton_conv_pool=False), cuda=True)["on"]
    assert on["triton_conv_pool_bwd"] is False and on["triton_pool"] is True
    assert resolved(train.Config(), cuda=True)["on"]["triton_conv_pool_bwd"] is True


def test_the_first_blocks_code_backward_is_off_without_its_forward():
    """It reads the Triton first block's kept code: with that block off it is off."""
    cfg = train.Config(triton_first_block=False)
    assert resolved(cfg, cuda=True)["on"]["triton_first_block_code"] is False
    assert speedups.BY_NAME["triton_first_block_code"].idle(
        train.asked_of(cfg), {"triton_first_block": False}) == \
        "it reads --triton-first-block's forward, which is off"
    assert resolved(train.Config(), cuda=True)["on"]["triton_first_block_code"]


def test_forward_mode_records_the_fused_sgd_off():
    cfg = train.parse_config(CPU + ["--mode", "forward"])
    assert cfg.fused_sgd and not resolved(cfg, cuda=False)["on"]["fused_sgd"]


def test_the_model_transforms_run_in_the_ladders_order_and_key_the_kept_model():
    used = {name: True for name in speedups.ORDER}
    transform = speedups.model_transform(used, Build(torch.bfloat16, 0.1))
    names, dtype = transform.key
    assert names == tuple(s.name for s in speedups.SPEEDUPS if s.model)
    assert dtype == torch.bfloat16


def test_one_process_keeps_one_cudnn_choice_when_it_measures_many_runs(monkeypatch):
    monkeypatch.setattr(cudnn_benchmark, "_first_choice", [])
    before = torch.backends.cudnn.benchmark
    try:
        off = {name: False for name in speedups.ORDER}
        speedups.set_process_flags(off, cuda=True, many_runs=True)
        speedups.set_process_flags(off, cuda=True, many_runs=True)
        with pytest.raises(UserError, match="must start in a new process"):
            speedups.set_process_flags({**off, "cudnn_benchmark": True}, cuda=True,
                                       many_runs=True)
        # A single run (train.py, the tests) is not held to it.
        speedups.set_process_flags({**off, "cudnn_benchmark": True}, cuda=True,
                                   many_runs=False)
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
