"""The scaling against a one-GPU run (profiling/scaling.py) compares like with like: the
sustained rates where both runs have one, else both runs' profiled steps."""

import json

import pytest

from profiling.scaling import scaling


def _summary(batch: int, world: int, profiled_ms: float, sustained: float | None) -> dict:
    summary = {"status": "complete", "config": {"batch_size": batch, "mode": "train"},
               "step": {"cpu_ms": profiled_ms},
               "sustained": {"samples_per_s": sustained} if sustained else None}
    if world > 1:
        summary["distributed"] = {"world": world}
    return summary


def _baseline(tmp_path, **kw) -> str:
    (tmp_path / "summary.json").write_text(json.dumps(_summary(1024, 1, **kw)))
    return str(tmp_path)


def test_the_sustained_rates_decide_where_both_runs_have_them(tmp_path):
    """Two H100s, DDP (make scaling, 2026-11-25): profiled steps of 40.8 ms under the
    profiler, a sustained 75,057 samples/s; one GPU 25.5 ms and 46,941."""
    job = _summary(1024, 2, profiled_ms=40.76, sustained=75057.0)
    got = scaling(job, _baseline(tmp_path, profiled_ms=25.52, sustained=46941.0))
    assert got["basis"] == "sustained"
    assert got["factor"] == pytest.approx(75057 / 46941)
    assert got["efficiency"] == pytest.approx(75057 / 46941 / 2)
    assert got["baseline_samples_per_s"] == 46941.0


@pytest.mark.parametrize("job_rate,base_rate", [(None, 46941.0), (75057.0, None)])
def test_a_run_without_a_sustained_rate_makes_both_use_their_profiled_steps(tmp_path,
                                                                           job_rate,
                                                                           base_rate):
    job = _summary(1024, 2, profiled_ms=40.0, sustained=job_rate)
    got = scaling(job, _baseline(tmp_path, profiled_ms=25.0, sustained=base_rate))
    assert got["basis"] == "profiled steps"
    assert got["factor"] == pytest.approx((2048 / 0.040) / (1024 / 0.025))


def test_a_baseline_is_compared_without_the_speedups_only_several_ranks_take(tmp_path):
    """A one-GPU run cannot ask for a several-rank speed-up (tp's graphed head): the job
    that turns it on or off still has that run as its baseline (make throughput's B runs
    had to leave --against out, results/several-gpus.md); a speed-up one GPU can take, set
    apart, is still refused."""
    import dataclasses

    import train
    from core.errors import UserError
    from profiling.scaling import check_baseline
    from training import speedups
    several = [s.name for s in speedups.SPEEDUPS if s.several_ranks]
    assert several  # else this test says nothing
    one = dataclasses.asdict(train.Config())
    (tmp_path / "summary.json").write_text(json.dumps(
        {**_summary(1024, 1, profiled_ms=25.0, sustained=None), "config": one}))
    for value in ("on", "off"):
        check_baseline(str(tmp_path), {**one, **{name: value for name in several}})
    other = next(s for s in speedups.SPEEDUPS if not s.several_ranks and not s.choice)
    with pytest.raises(UserError, match="speed-ups asked"):
        check_baseline(str(tmp_path), {**one, other.name: not one[other.name]})
