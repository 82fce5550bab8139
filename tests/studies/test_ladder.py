"""make ladder: the baseline, then each speed-up added, each rung a run on the same batches;
a rung that cannot run here is a row that says why."""

import csv
import json
from pathlib import Path

import pytest
import torch

from studies import ladder
from tests.helpers import TINY, interrupt_at_run
from training.speedups import ORDER as SPEEDUPS
from training.speedups import SPEEDUPS as SPEEDUP_RECORDS

# On the CPU batch 2, not TINY's 4: the rungs' Triton kernels run in Triton's interpreter,
# a program at a time, and what the test claims (every rung, the same first losses) holds
# at any batch; the suite's slowest test took 0.6 of its time. On a GPU, TINY as it was.
# (The last --batch-size given wins, as for any option.)
LADDER_SIZE = TINY if torch.cuda.is_available() else [*TINY, "--batch-size", "2"]


def test_a_tiny_ladder_writes_every_rung_and_says_which_could_not_run(tmp_path, capsys):
    out = tmp_path / "ladder"
    assert ladder.main(["--out", str(out), "--strategies", "padded,kernel:triton",
                            *LADDER_SIZE]) == 0
    for name in ("ladder.md", "ladder.csv", "ladder.png", "ladder-kernels.md", "skipped.json"):
        assert (out / name).exists(), name
    rows = list(csv.DictReader((out / "ladder.csv").open()))
    assert [(r["strategy"], r["rung"]) for r in rows] == [
        (s, rung) for s in ("padded", "kernel/triton")
        for rung in ("baseline", *(f"+ {n}" for n in SPEEDUPS))]
    ran = [r for r in rows if r["run folder"]]
    # Same seed, same batches: every rung's first losses agree (printed to 4 places).
    assert len({r["first losses"] for r in ran}) == 1
    if not torch.cuda.is_available():
        skipped = {(r["strategy"], r["rung"]): r["step GPU ms"] for r in rows
                   if not r["run folder"]}
        # The registry's GPU-only speed-ups skipped, every other rung run: the baseline,
        # fused_sgd, channels_last and the Triton kernels (in Triton's interpreter).
        gpu_only = [s.name for s in SPEEDUP_RECORDS if s.gpu_only]
        assert set(skipped) == {(s, f"+ {n}") for s in ("padded", "kernel/triton")
                                for n in gpu_only}
        assert all(v == "skipped: needs a CUDA GPU" for v in skipped.values())
        assert len(ran) == 2 * (1 + len(SPEEDUPS) - len(gpu_only)) >= 2 * 9
    for r in ran:
        assert (out / Path(r["run folder"]).name / "summary.json").exists(), r["run folder"]
    # Each rung's run holds every speed-up of the rungs before it.
    last = json.loads((out / "padded-5-triton_second_block" / "summary.json").read_text())
    on = last["speedups"]["on"]
    assert on["fused_sgd"] and on["channels_last"] and on["triton_first_block"]
    assert last["config"]["baseline"] is True


@pytest.mark.parametrize("option", [["--loss", "padded"], ["--baseline"], ["--fused-sgd"],
                                    ["--no-triton-first-block"], ["--cuda-graph", "on"],
                                    ["--no-fused-sgd"]])
def test_options_set_per_rung_are_refused(tmp_path, capsys, option):
    assert ladder.main(["--out", str(tmp_path / "x"), *option, *TINY]) == 2
    assert "is set per rung by make ladder" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_an_unknown_strategy_names_what_make_ladder_took(tmp_path, capsys):
    """make ladder LADDER=foo named --strategies, which the user never typed."""
    assert ladder.main(["--strategies", "foo", "--out", str(tmp_path / "x"), *TINY]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown strategy 'foo' in --strategies (make: LADDER=)" in err[0]


def test_a_ladder_is_never_overwritten(tmp_path, capsys):
    (tmp_path / "ladder.md").write_text("x")
    assert ladder.main(["--out", str(tmp_path), *TINY]) == 2
    assert "already holds a ladder" in capsys.readouterr().err


def test_on_a_cpu_the_triton_block_rungs_run_only_at_sizes_that_take_seconds():
    import train
    preset = train.parse_config(["--preset", "cpu", "--baseline"])
    for block in ("triton_first_block", "triton_second_block", "triton_pool",
                  "triton_conv_pool", "triton_conv_pool_bwd"):
        reason = ladder.why_not_here(block, preset, "padded", cuda=False)
        assert reason.startswith("Triton's interpreter would take ~105 s a step here")
        assert ladder.why_not_here(block, preset, "padded", cuda=True) is None
        tiny = train.parse_config([*TINY, "--baseline"])
        assert ladder.why_not_here(block, tiny, "padded", cuda=False) is None


def test_kernel_names_keep_what_tells_them_apart():
    a = ("void at::native::(anonymous namespace)::multi_tensor_apply_kernel<at::native::"
         "(anonymous namespace)::TensorListMetadata<3>, at::native::(anonymous namespace)::"
         "FusedSgdMathFunctor<float, 3>>(...)")
    short = ladder.short_kernel_name(a)
    assert short.startswith("multi_tensor_apply_kernel<TensorListMetadata<3>, FusedSgd")


def test_ctrl_c_keeps_the_rungs_that_finished(tmp_path, monkeypatch):
    """Ctrl-C during the second rung (here, the group's processes run in this one): the
    ladder of the first rung, opened by a line saying so, in <out>-interrupted/, whose
    run folders its rows name; the group's listing says at which rung it stopped."""
    from core.errors import StudyInterrupted
    interrupt_at_run(monkeypatch, ladder, 2)
    monkeypatch.setattr(ladder, "_run_group", lambda argv: ladder._main(argv[3:]))
    out = tmp_path / "lad"
    with pytest.raises(StudyInterrupted) as caught:
        ladder.main(["--out", str(out), "--strategies", "padded", *TINY])
    kept = tmp_path / "lad-interrupted"
    assert str(caught.value) == (f"interrupted (Ctrl-C); kept in {kept} (1 of "
                                 f"{1 + len(SPEEDUPS)} rungs finished)")
    assert [p.name for p in tmp_path.iterdir()] == ["lad-interrupted"]
    assert (kept / "ladder.md").read_text().startswith("**Interrupted** after 1 of ")
    rows = [r for r in csv.DictReader((kept / "ladder.csv").open()) if r["run folder"]]
    assert [r["rung"] for r in rows] == ["baseline"]
    assert (Path(rows[0]["run folder"]) / "summary.json").exists()
    assert not list(kept.glob(".*-claimed"))


def test_the_ladder_runs_each_rung_with_the_rungs_below_it_on(tmp_path, monkeypatch):
    """run_ladder makes each rung's config with every rung below it on (here as on a GPU,
    the runs themselves stubbed): the third block's Triton backward rung runs with its
    forward's rung on, which it needs (idle otherwise)."""
    made = []
    monkeypatch.setattr(ladder.torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(ladder, "attempt", lambda cfg, tag: (made.append(cfg), (None, "stub"))[1])
    runs, skipped = {}, []
    ladder.run_ladder(tmp_path, ["--preset", "cpu", "--amp", *TINY[2:]], [("padded", "triton")],
                      runs, skipped, rungs=("triton_conv_pool", "triton_conv_pool_bwd"))
    assert [row["step GPU ms"] for row in skipped] == ["stub", "stub"], skipped
    last = made[-1]
    assert last.triton_conv_pool_bwd and last.triton_conv_pool and last.fused_sgd
