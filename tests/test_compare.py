"""make compare: the side-by-side table comes from the runs' summaries, a rebuild from the
run folders gives the same table, and the counts agree with a real GPU trace."""

import json
from pathlib import Path

import pytest

from profiling import run_comparison
from profiling.compare import compare_rows, load_summary

FIXTURES = Path(__file__).parent / "fixtures"
TINY = ["--preset", "cpu", "--batch-size", "4", "--image-size", "32", "--hidden", "32",
        "--num-workers", "0", "--wait", "0", "--warmup", "1", "--active", "2"]


def test_compare_runs_then_rebuilds_the_same_table(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert run_comparison.main(["--out", str(out), "--strategies", "loop,padded,kernel:cuda",
                                "--modes", "forward", *TINY]) == 0
    table = (out / "comparison.md").read_text()
    for name in ("comparison.csv", "comparison.png", "skipped.json"):
        assert (out / name).exists(), name
    assert list((out / "comparison").glob("events.out.tfevents.*"))

    loop = json.loads((out / "loop-forward" / "summary.json").read_text())
    padded = json.loads((out / "padded-forward" / "summary.json").read_text())
    rows = {r["strategy"]: r for r in compare_rows([loop, padded])}
    assert rows["padded"]["loss CPU ms"] == padded["phases"]["loss"]["cpu_ms"]
    assert rows["padded"]["step CPU ms"] == padded["step"]["cpu_ms"]
    assert rows["padded"]["loss speed-up vs loop"] == pytest.approx(
        loop["phases"]["loss"]["cpu_ms"] / padded["phases"]["loss"]["cpu_ms"])
    assert f"{padded['phases']['loss']['cpu_ms']:.3f}" in table
    import torch
    if not torch.cuda.is_available():
        assert "| kernel/cuda | forward | skipped: the CUDA kernel backend needs" in table

    (out / "comparison.md").unlink()
    assert run_comparison.main(["--runs", str(out / "loop-forward"),
                                str(out / "padded-forward")]) == 0
    assert (out / "comparison.md").read_text() == table
    # One run: the comparison still goes beside it, never inside the run's folder.
    assert run_comparison.main(["--runs", str(out / "padded-forward")]) == 0
    assert not (out / "padded-forward" / "comparison.md").exists()
    assert "| padded | forward |" in (out / "comparison.md").read_text()


def test_unknown_strategy_is_refused(tmp_path, capsys):
    assert run_comparison.main(["--out", str(tmp_path / "x"), "--strategies", "fast"]) == 2
    assert "unknown strategy 'fast'" in capsys.readouterr().err


def test_counts_match_the_gpu_trace_fixture():
    """Launches, copies and syncs per step, from real H100 traces (a few steps, batch 32)."""
    rows = {r["strategy"]: r for r in compare_rows(
        [load_summary(FIXTURES / f"gpu_{n}_train.summary.json") for n in ("padded", "kernel")])}
    kernel, padded = rows["kernel/triton"], rows["padded"]
    assert (kernel["loss launches"], kernel["loss bwd launches"]) == (2, 1)
    assert padded["loss launches"] > 2 and padded["loss bwd launches"] > 1
    for row in (kernel, padded):
        assert row["H2D copies"] == 3 and row["syncs"] == 0
        assert row["loss GPU ms"] > 0 and row["peak GPU GB"] > 0


def test_the_loop_gets_fewer_steps_unless_the_user_sets_them():
    assert run_comparison.loop_steps([]) == ["--warmup", "1", "--active", "2"]
    assert run_comparison.loop_steps(["--active", "5"]) == ["--warmup", "1"]
    assert run_comparison.loop_steps(TINY) == []
