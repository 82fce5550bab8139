"""--lin1-update-beside-trunk: lin1's update leaves the optimizer's step for its gradient's
hook (on a GPU, a side stream joined before the next head), and gives the same bits as the
update in the step; where it applies and where it says why not."""

import pytest
import torch

import train
from tests.helpers import SMALL, model_with, resolved, shadow_steps
from training import speedups

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]
BOTH = {"bf16_shadow", "lin1_update_beside_trunk"}


def _steps(names, seed, device, steps=3):
    """(losses, lin1's master, momentum, bf16 weight, model, optimizer) after `steps` train
    steps of an uncompiled model (fp32 master weights, bf16 autocast)."""
    values, model, optimizer = shadow_steps(names, seed, device, steps)
    return (values, model.lin1_master.cpu(), optimizer.buffers[0].cpu(),
            model.lin1.weight.detach().cpu(), model, optimizer)


@pytest.mark.parametrize("device", DEVICES)
def test_the_update_from_the_hook_gives_the_steps_bits(device):
    seed = torch.randint(0, 2**31, ()).item()
    step = _steps({"bf16_shadow"}, seed, device)
    hook = _steps(BOTH, seed, device)
    for a, b in zip(step[:4], hook[:4]):
        assert torch.equal(a, b)
    assert not torch.equal(hook[1], model_with(BOTH, 32, 16, 64, seed)[0].lin1_master)


def test_the_optimizers_step_leaves_lin1_to_the_hook():
    seed = torch.randint(0, 2**31, ()).item()
    model, optimizer = model_with(BOTH, 32, 16, 64, seed, lr=0.5)
    assert optimizer.updated_elsewhere is model.lin1_update
    master = model.lin1_master.clone()
    model.lin1.weight.grad = torch.ones_like(model.lin1.weight)  # no backward: no hook
    optimizer.step()
    assert torch.equal(model.lin1_master, master)


def test_a_new_optimizer_of_a_kept_model_takes_the_hook_over():
    """make compare and make ladder keep a model between runs and make a new optimizer
    each run: one backward then updates lin1 once, by the new one."""
    seed = torch.randint(0, 2**31, ()).item()
    model, first = model_with(BOTH, 32, 16, 64, seed, lr=0.5)
    used = {name: name in BOTH for name in speedups.ORDER}
    second = speedups.make_optimizer(model, used, speedups.build_context(
        True, 0.5, torch.device("cpu")))
    assert len(model.lin1_update.handles) == 1
    images = torch.randint(0, 255, (2, 1, 32, 32), dtype=torch.uint8)
    with torch.autocast("cpu", dtype=torch.bfloat16):  # lin1's weight is bf16
        model(images).float().sum().backward()
    assert first.buffers[0] is None and second.buffers[0] is not None


def test_a_model_and_its_optimizer_are_freed_after_their_run():
    """The gradient's hook must not hold the optimizer: a parameter's hooks live on the C++
    side, where the garbage collector cannot break a cycle through them, and make ladder
    builds a model a rung (each left alive ran the GPU out of memory)."""
    import gc
    import weakref
    seed = torch.randint(0, 2**31, ()).item()
    *_, model, optimizer = _steps(BOTH, seed, "cpu", steps=1)
    refs = [weakref.ref(x) for x in (model, optimizer, model.lin1_update)]
    del model, optimizer
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


def test_it_is_on_where_it_applies_and_says_why_not_elsewhere():
    on = resolved(train.Config(), cuda=True)["on"]
    assert on["lin1_update_beside_trunk"] and on["bf16_shadow"]
    off = resolved(train.Config(bf16_shadow=False), cuda=True)
    assert not off["on"]["lin1_update_beside_trunk"]
    assert "--bf16-shadow's update" in off["lin1_update_beside_trunk_off_because"]
    graph = resolved(train.Config(cuda_graph="on"), cuda=True)
    assert not graph["on"]["lin1_update_beside_trunk"] and graph["on"]["cuda_graph"]
    assert "runs on into the next step's forward" in \
        graph["lin1_update_beside_trunk_off_because"]
    both = train.asked_of(train.Config(cuda_graph="on", lin1_update_beside_trunk="on"))
    assert "--lin1-update-beside-trunk on" in speedups.BY_NAME["cuda_graph"].why_not(both, True)


@pytest.mark.gpu
def test_the_compiled_step_keeps_its_losses_with_the_update_beside(tmp_path):
    """train.py's compiled step at a small size: the model compiles as two graphs (the
    join between trunk and head), the update runs on the side stream; the losses are the
    step's with it in the optimizer (the two graphs may fuse the boundary differently)."""
    runs = [train.run(train.parse_config(SMALL + ["--out-dir", str(tmp_path), "--active",
                                                  "4", "--run-name", f"r{value}",
                                                  "--lin1-update-beside-trunk", value]))
            for value in ("off", "auto")]
    assert [r["speedups"]["on"]["lin1_update_beside_trunk"] for r in runs] == [False, True]
    assert runs[1]["losses"] == pytest.approx(runs[0]["losses"], rel=1e-3)


@pytest.mark.gpu
def test_the_step_runs_on_a_high_priority_stream_only_where_it_is_on():
    from training.speedups.lin1_update_beside_trunk import step_stream
    try:
        step_stream(True, cuda=True, many_runs=True)
        assert torch.cuda.current_stream().priority < torch.cuda.default_stream().priority
    finally:
        step_stream(False, cuda=True, many_runs=True)
    assert torch.cuda.current_stream() == torch.cuda.default_stream()


@pytest.mark.parametrize("loss", ["loop", "concat", "nested"])
def test_auto_leaves_the_host_bound_strategies_without_it_and_on_still_applies(loss):
    """Their GPU idles most of each step: auto keeps the update in the optimizer, with the
    reason; on is a choice the user may still make there."""
    auto = resolved(train.Config(loss=loss), cuda=True)
    assert not auto["on"]["lin1_update_beside_trunk"]
    assert f"the {loss} strategy is host-bound" in \
        auto["lin1_update_beside_trunk_off_because"]
    assert "no lin1_update_beside_trunk: the" in speedups.describe_used(auto)
    on = train.Config(loss=loss, lin1_update_beside_trunk="on")
    speedups.check(train.asked_of(on), cuda=True)
    assert resolved(on, cuda=True)["on"]["lin1_update_beside_trunk"]


def test_auto_keeps_it_for_every_strategy_the_gpu_bounds():
    for loss in ("padded", "compiled", "kernel", "conditional", "packed", "compiled_packed"):
        assert resolved(train.Config(loss=loss), cuda=True)["on"][
            "lin1_update_beside_trunk"], loss
