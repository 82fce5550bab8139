"""--float8-lin1: lin1's GEMMs in float8, the first speed-up that changes the maths. The
weight's cast is torch's rounding in both layouts with a delayed scale; the GEMMs are
float64's on their rounded operands; the error against the unrounded float64 product
stays within float8's; a model's copies follow its weight after every update; a run stays
near the bf16 run's losses and says it changes the maths."""

import pytest
import torch

import train
from core.errors import InputError
from kernels.lin1.float8_cast import (
    AMAX_NOW,
    E4M3_MAX,
    SCALE,
    cast_weight,
    new_state,
)
from kernels.lin1.float8_linear import E4M3, E5M2, float8_linear, quantized
from kernels.lin1.master_halves import split
from kernels.lin1.shadow_sgd import shadow_sgd_step
from studies.compare_rows import compare_rows, load_summary
from tests.helpers import SMALL, resolved, shadow_steps
from tests.reference import rel_err
from training import speedups

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)]


def _weights(rows: int, cols: int, device) -> torch.Tensor:
    """Fresh bf16 values over 10 decades, both signs, and the edges: zeros of both signs,
    e4m3's ties and its subnormals once scaled (the largest is 1, so the scale is 448)."""
    w = torch.randn(rows, cols) * torch.logspace(-9, 1, cols)[torch.randperm(cols)]
    w = (w / w.abs().max()).bfloat16()
    edges = torch.tensor([0.0, -0.0, 1.0, -1.0, 9 / 448, 2.0 ** -9 / 448, 1.5 * 2 ** -9 / 448,
                          -2.5 * 2 ** -9 / 448, 17 / 448, 2 ** -12]).bfloat16()
    w[0, :len(edges)] = edges
    return w.to(device)


def _torch_cast(w: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return (w.float() * scale).clamp(-E4M3_MAX, E4M3_MAX).to(E4M3)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("shape", [(97, 161), (300, 200)])
def test_the_weight_cast_is_torchs_rounding_in_both_layouts_with_the_last_amax(device, shape):
    """First cast: the weight's own amax. Second, after the weight grew by half: the
    first one's amax (delayed), the grown values saturating at +-448, none NaN; the
    state then holds the grown weight's amax for the next."""
    w = _weights(*shape, device)
    w8 = torch.empty(shape, dtype=E4M3, device=device)
    w8t = torch.empty(shape[::-1], dtype=E4M3, device=device)
    state, inverse = new_state(w)
    last = w.float().abs().max()
    for step in range(2):
        cast_weight(w, w8, w8t, state, inverse)
        # The scale within fp32's division (the kernel's may round its last bit apart).
        assert float(state[SCALE]) == pytest.approx(float(E4M3_MAX / last), rel=1e-6)
        assert float(inverse) == pytest.approx(1 / float(state[SCALE]), rel=1e-6)
        expected = _torch_cast(w, state[SCALE])
        assert torch.equal(_bits(w8), _bits(expected)), step
        assert torch.equal(_bits(w8t), _bits(expected.t().contiguous())), step
        last = w.float().abs().max()
        assert state[AMAX_NOW:].max() == last and not w8.float().isnan().any()
        w = (w.float() * 1.5).bfloat16()
    assert (w8.float().abs() == E4M3_MAX).sum() > 0  # the grown values saturated


def test_the_weight_cast_refuses_what_it_cannot_cast():
    w = torch.zeros(32, 16, dtype=torch.bfloat16)
    w8, w8t = torch.empty(32, 16, dtype=E4M3), torch.empty(16, 32, dtype=E4M3)
    state, inverse = new_state(w)
    with pytest.raises(InputError, match="bf16 weight"):
        cast_weight(w.float(), w8, w8t, state, inverse)
    with pytest.raises(InputError, match=r"\[in, out\]"):
        cast_weight(w, w8, w8, state, inverse)
    with pytest.raises(InputError, match="its inverse\\s+fp32 0-dim"):
        cast_weight(w, w8, w8t, state, state[:1])


def _update_state(form: str, device):
    """A [37, 160] weight's shadow state (5,920 elements: both kernels' last block ends
    part-way; rows of whole tie words): {"master" (the low half under a split), "ties",
    "weight", "buf", "grad"} in the form's tensors."""
    master = torch.randn(37, 160, device=device)
    grad = torch.randn(37, 160, device=device).bfloat16()
    buf = torch.empty(37, 160, device=device)
    if form == "fp32 master":
        return dict(master=master, weight=master.bfloat16(), buf=buf, grad=grad)
    weight, low, ties = split(master)
    return dict(master=low, ties=ties, weight=weight, buf=buf, grad=grad)


def _copies(weight):
    w8 = torch.empty(weight.shape, dtype=E4M3, device=weight.device)
    w8t = torch.empty(weight.shape[::-1], dtype=E4M3, device=weight.device)
    state, inverse = new_state(weight)
    cast_weight(weight, w8, w8t, state, inverse)  # as the build casts
    return w8, w8t, state, inverse


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", ["fp32 master", "split master", "split, skipping"])
def test_the_updates_kernel_writes_the_copies_the_cast_would(device, form):
    """Two updates (the first and a later one): the shadow SGD writing the float8 copies as
    it updates (its roll before, its transpose after) leaves the weight, master and
    momentum as the SGD alone does, and the copies, scale state and inverse that the
    separate cast of the updated weight gives, bit for bit."""
    fused = _update_state(form, device)
    before = fused["weight"].clone()
    alone = {k: v.clone() for k, v in fused.items()}
    fused_copies, alone_copies = _copies(fused["weight"]), _copies(alone["weight"])
    for first in (True, False):
        for run, copies in ((fused, fused_copies), (alone, alone_copies)):
            shadow_sgd_step(run["master"], run["grad"], run["buf"], run["weight"], 0.5, 0.9,
                            first, run.get("ties"), skip_unchanged=form == "split, skipping",
                            float8=copies if run is fused else None)
            if run is alone:
                cast_weight(run["weight"], *copies)
        for name in fused:
            assert torch.equal(fused[name], alone[name]), (name, first)
        (w8, w8t, state, inverse), ref = fused_copies, alone_copies
        assert torch.equal(_bits(w8), _bits(ref[0])) and torch.equal(_bits(w8t), _bits(ref[1]))
        # The amaxes land in other slots (blocks, not tiles): their max is what rolls.
        assert torch.equal(state[:AMAX_NOW], ref[2][:AMAX_NOW]), first
        assert torch.equal(state[AMAX_NOW:].max(), ref[2][AMAX_NOW:].max()), first
        assert torch.equal(inverse, ref[3]), first
    assert not torch.equal(fused["weight"], before)  # the updates moved the weight


def test_the_updates_float8_copy_is_refused_where_it_does_not_fit():
    run = _update_state("fp32 master", "cpu")
    w8, w8t, state, inverse = _copies(run["weight"])
    for bad, match in (((w8t, w8, state, inverse), r"\[out, in\]"),
                       ((w8.view(torch.uint8), w8t, state, inverse), "float8_e4m3fn"),
                       ((w8, w8t, state[:3], inverse), r"fp32 \[66\]"),
                       ((w8, w8t, state, state[:1]), "inverse"),
                       ((w8, w8t, state, inverse.to("meta")), "weight's device")):
        with pytest.raises(InputError, match=match):
            shadow_sgd_step(run["master"], run["grad"], run["buf"], run["weight"], 0.5, 0.9,
                            True, float8=bad)
    flat = {k: v.view(-1) for k, v in run.items()}
    with pytest.raises(InputError, match="2-D weight"):
        shadow_sgd_step(flat["master"], flat["grad"], flat["buf"], flat["weight"], 0.5, 0.9,
                        True, float8=(w8, w8t, state, inverse))
    assert torch.equal(state, _copies(run["weight"])[2])  # no refusal rolled the scale


def _float64(t):
    return t.detach().to(torch.float64)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
@pytest.mark.parametrize("bias", [True, False])
def test_the_float8_gemms_are_float64s_on_their_rounded_operands(device, dtype, bias):
    """Output, input and weight gradients: within bf16's rounding (1e-2 relative) of
    float64's product of the same float8 operands and scales, and within float8's error
    (e4m3 for the forward, e5m2's gradient for the backward) of the unrounded product."""
    seed = torch.randint(0, 2**31, ()).item()
    torch.manual_seed(seed)
    B, features, hidden = 64, 512, 96
    w = _weights(hidden, features, device) / features ** 0.5
    x = torch.randn(B, features, device=device).relu().to(dtype).requires_grad_()
    b = torch.randn(hidden, device=device, requires_grad=True) if bias else None
    weight = w.clone().requires_grad_()
    w8 = torch.empty(hidden, features, dtype=E4M3, device=device)
    w8t = torch.empty(features, hidden, dtype=E4M3, device=device)
    state, inverse = new_state(w)
    cast_weight(w, w8, w8t, state, inverse)
    y = float8_linear(x, weight, b, w8, w8t, inverse)
    dy = torch.randn(B, hidden, device=device, dtype=torch.bfloat16)
    y.backward(dy)
    assert (y.dtype, x.grad.dtype, weight.grad.dtype) == (torch.bfloat16, dtype, torch.bfloat16)
    # float64 over the float8 operands, dequantized by the same scales.
    x8, sx = quantized(x, E4M3)
    dy8, sdy = quantized(dy, E5M2)
    xq, wq, dyq = _float64(x8) * _float64(sx), _float64(w8) * float(inverse), \
        _float64(dy8) * _float64(sdy)
    bias64 = _float64(b) if bias else 0
    assert rel_err(y, xq @ wq.T + bias64) < 1e-2, seed
    assert rel_err(x.grad, dyq @ wq) < 1e-2, seed
    assert rel_err(weight.grad, dyq.T @ xq) < 1e-2, seed
    if bias:
        assert rel_err(b.grad, _float64(dy).sum(0)) < 1e-5, seed
    # Against the unrounded product: float8's own error, and no more.
    x64, w64, dy64 = _float64(x), _float64(w), _float64(dy)
    assert rel_err(y, x64 @ w64.T + bias64) < 0.06, seed
    assert rel_err(x.grad, dy64 @ w64) < 0.15, seed
    assert rel_err(weight.grad, dy64.T @ x64) < 0.15, seed


@pytest.mark.parametrize("device", DEVICES)
def test_a_zero_input_gives_zero_output_and_gradients_not_nan(device):
    x = torch.zeros(16, 32, device=device, dtype=torch.bfloat16, requires_grad=True)
    w = _weights(16, 32, device).requires_grad_()
    w8, w8t = torch.empty(16, 32, dtype=E4M3, device=device), \
        torch.empty(32, 16, dtype=E4M3, device=device)
    state, inverse = new_state(w)
    cast_weight(w.detach(), w8, w8t, state, inverse)
    y = float8_linear(x, w, None, w8, w8t, inverse)
    y.backward(torch.zeros_like(y))
    for t in (y, x.grad, w.grad):
        assert torch.equal(t, torch.zeros_like(t))


def test_sizes_that_are_not_multiples_of_16_are_one_error():
    x = torch.zeros(12, 32, dtype=torch.bfloat16)
    w8 = torch.zeros(16, 32, dtype=E4M3)
    with pytest.raises(InputError, match="multiples of 16: batch 12, features 32, hidden 16"):
        float8_linear(x, torch.zeros(16, 32, dtype=torch.bfloat16), None, w8, w8.t(),
                      torch.ones(()))


def test_it_is_off_by_default_says_it_changes_the_maths_and_is_idle_without_the_shadow():
    spec = speedups.BY_NAME["float8_lin1"]
    assert train.Config().float8_lin1 is False and spec.changes_maths
    on = resolved(train.Config(float8_lin1=True), cuda=True)
    assert on["on"]["float8_lin1"]
    assert speedups.maths_changed(on["on"]) == spec.changes_maths
    assert "CHANGES THE MATHS: lin1's GEMMs in float8" in speedups.describe_used(on)
    alone = train.Config(**{**speedups.baseline_values(), "float8_lin1": True})
    assert not resolved(alone, cuda=True)["on"]["float8_lin1"]
    assert "needs bf16 autocast" in spec.why_not(train.asked_of(
        train.Config(float8_lin1=True, amp=False)), cuda=True)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("beside,master", [(False, "split"), (True, "split"),
                                           (False, "fp32")])
def test_the_models_float8_copies_follow_its_weight_after_every_update(device, beside,
                                                                       master):
    """Three steps with lin1's update in the optimizer's step or beside the trunk (on a
    CPU, in place), its master split or fp32: the copies are the last cast of the weight
    the update left (lr 0.5: every step moves it), scaled by the amax of the weight
    before it."""
    names = {"bf16_shadow", "float8_lin1"} | ({"split_master"} if master == "split" else
                                             set()) | (
        {"lin1_update_beside_trunk"} if beside else set())
    values, model, _ = shadow_steps(names, torch.randint(0, 2**31, ()).item(), device,
                                    batch=16)  # float8 GEMMs: multiples of 16
    lin1 = model.lin1
    if device == "cuda":
        torch.cuda.synchronize()  # host-device sync: the check reads the side stream's work
    expected = _torch_cast(lin1.weight.detach(), lin1.float8_state[SCALE])
    assert torch.equal(_bits(lin1.weight_e4m3), _bits(expected))
    assert torch.equal(_bits(lin1.weight_e4m3_t), _bits(expected.t().contiguous()))
    assert lin1.float8_state[AMAX_NOW:].max() == lin1.weight.detach().float().abs().max()
    assert torch.isfinite(values).all() and values.shape == (3,)


@pytest.mark.parametrize("device", DEVICES)
def test_the_float8_models_losses_stay_near_the_bf16_models(device):
    """Three steps of the same model, batches and seed with and without float8 (lr 0.5):
    the losses differ (float8 ran) by under 2 %."""
    seed = torch.randint(0, 2**31, ()).item()
    names = {"bf16_shadow", "split_master"}
    bf16, _, _ = shadow_steps(names, seed, device, batch=16)
    f8, _, _ = shadow_steps(names | {"float8_lin1"}, seed, device, batch=16)
    assert not torch.equal(f8, bf16), seed
    torch.testing.assert_close(f8, bf16, rtol=2e-2, atol=0)


@pytest.mark.gpu
def test_a_float8_run_stays_near_the_bf16_runs_losses_and_says_so(tmp_path):
    runs = {}
    for name, extra in (("bf16", []), ("float8", ["--float8-lin1"])):
        runs[name] = train.run(train.parse_config(
            SMALL + ["--out-dir", str(tmp_path), "--run-name", name, "--active", "6",
                     *extra]))
    bf16, f8 = runs["bf16"], runs["float8"]
    assert f8["speedups"]["on"]["float8_lin1"] and not bf16["speedups"]["on"]["float8_lin1"]
    assert f8["losses"] != bf16["losses"]  # the float8 GEMMs ran
    assert f8["losses"] == pytest.approx(bf16["losses"], rel=2e-2)
    syncs = [sum(p["syncs"] for p in r["phases"].values()) for r in (bf16, f8)]
    assert syncs[1] == syncs[0]  # no host sync of its own
    rows = compare_rows([load_summary(tmp_path / name) for name in runs])
    assert [r["maths"] for r in rows] == ["same", "lin1's GEMMs in float8"]
