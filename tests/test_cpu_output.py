"""What a newcomer reads on a machine without a GPU: no figure that looks measured where
nothing could be, charts that say their times are not a GPU's, no profiler noise, and
messages that name the make variable the user typed."""

import pytest

from profiling.table import CPU_NOTE, format_table
from studies import charts
from tests.helpers import cli

SUMMARY = {"phases": {"forward": {"cpu_ms": 1.5, "gpu_ms": 0.0, "launches": 0.0,
                                  "h2d_copies": 0.0, "syncs": 0.0}},
           "step": {"cpu_ms": 2.0, "gpu_ms": 0.0}, "steps": 2}


def test_a_cpu_table_says_not_measured_where_no_gpu_figure_exists():
    lines = format_table(SUMMARY, "t", on_gpu=False).splitlines()
    forward = next(line for line in lines if line.startswith("| forward"))
    cells = [c.strip() for c in forward.strip("|").split("|")]
    assert cells == ["forward", "1.500", "-", "-", "-", "-"]
    assert CPU_NOTE in lines
    gpu = format_table(SUMMARY, "t", on_gpu=True)
    assert "0.0 |" in gpu and CPU_NOTE not in gpu  # on a GPU a zero count is a count


def test_a_cpu_run_prints_no_profiler_markers(tmp_path, monkeypatch):
    """libkineto's 'USDT: ... profiler_start' lines (torch 2.13's CPU build) are hidden;
    a KINETO_LOG_LEVEL the user sets still wins."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("the markers are hidden on a CPU only")
    monkeypatch.delenv("KINETO_LOG_LEVEL", raising=False)
    done = cli("--out-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    assert "USDT" not in done.stderr, done.stderr[-2000:]
    assert charts.CPU_NOTE not in done.stdout  # the table's own note, not the charts'
    assert CPU_NOTE in done.stdout


def test_a_nested_run_prints_no_note_for_torchs_developers(tmp_path):
    """torch's 'is_fx_tracing will return true ...' note, which every nested run printed,
    is gone; the run's own lines stay."""
    done = cli("--out-dir", str(tmp_path), "--loss", "nested")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "is_fx_tracing" not in done.stderr and "written:" in done.stdout


def _drawn(monkeypatch, draw) -> object:
    """The matplotlib figure a chart function would save."""
    kept = []
    monkeypatch.setattr(charts, "_save", lambda plt, fig, path, dpi: kept.append(fig))
    draw()
    return kept[0]


CPU_ROWS = [{"strategy": s, "mode": "train", "step CPU ms": ms, "step GPU ms": None}
            for s, ms in (("padded", 3.0), ("concat", 5.0))]


def test_the_comparison_chart_on_a_cpu_says_so_and_draws_no_gpu_bars(tmp_path, monkeypatch):
    fig = _drawn(monkeypatch, lambda: charts.compare_chart(CPU_ROWS, tmp_path / "c.png",
                                                           "CPU here"))
    assert fig._suptitle.get_text() == f"{charts.CPU_NOTE}\nCPU here"
    right = fig.axes[1]
    assert [t.get_text() for t in right.get_legend().get_texts()] == ["step CPU"]
    assert "no GPU times here" in right.get_title()


def test_the_comparison_chart_on_a_gpu_has_both_bars(tmp_path, monkeypatch):
    rows = [dict(r, **{"step GPU ms": 2.0}) for r in CPU_ROWS]
    fig = _drawn(monkeypatch, lambda: charts.compare_chart(rows, tmp_path / "c.png", "H200"))
    assert fig._suptitle.get_text() == "H200"
    assert [t.get_text() for t in fig.axes[1].get_legend().get_texts()] == ["step GPU",
                                                                            "step CPU"]


def test_every_chart_names_the_device_and_commit_of_its_figures(tmp_path, monkeypatch):
    """A picture copied into a doc still says where it was measured: each chart's top line
    is where_of its runs' environments."""
    where = charts.where_of([{"device": "NVIDIA H200", "commit": "2c7a526abcdef"},
                             {"device": "NVIDIA H200", "commit": "2c7a526abcdef"},
                             {"device": "NVIDIA H100 80GB HBM3", "commit": "0f754f6",
                              "dirty": True}, None])
    assert where == ("NVIDIA H200, commit 2c7a526; NVIDIA H100 80GB HBM3, commit 0f754f6 "
                     "with changes; device not recorded, commit not recorded")
    assert charts.where_of([]) == "nothing measured"
    ladder = [{"strategy": "padded", "rung": "baseline", "step CPU ms": 3.0}]
    steps = [("padded", [{"step": i, "device_ms": None, "host_ms": 2.0} for i in range(3)])]
    throughput = [{"strategy": "padded", "sustained samples/s": 10.0, "timer": "host wall"}]
    for draw in (lambda: charts.compare_chart(CPU_ROWS, tmp_path / "c.png", where),
                 lambda: charts.ladder_chart(ladder, tmp_path / "l.png", where, 18.0),
                 lambda: charts.throughput_chart(throughput, tmp_path / "t.png", where),
                 lambda: charts.step_times_chart(steps, tmp_path / "s.png", where)):
        assert _drawn(monkeypatch, draw)._suptitle.get_text().endswith(where)


def test_the_comparison_chart_draws_close_steps_close(tmp_path, monkeypatch):
    """nested at 569 and padded at 550 ms looked several times apart on a log axis: the
    step panel is linear from zero; the loss panel goes to log only for bars over WIDE
    times apart, and says so."""
    rows = [{"strategy": s, "mode": m, "step CPU ms": ms, "step GPU ms": None,
             "loss CPU ms": ms} for s, ms in (("padded", 550.0), ("nested", 569.0))
            for m in ("train", "forward")]
    fig = _drawn(monkeypatch, lambda: charts.compare_chart(rows, tmp_path / "c.png", "H200"))
    left, right = fig.axes[:2]
    assert right.get_yscale() == "linear" and right.get_ylim()[0] == 0
    assert left.get_yscale() == "linear" and "log" not in left.get_title()
    rows[1]["loss CPU ms"] = 550.0 * (charts.WIDE + 1)
    fig = _drawn(monkeypatch, lambda: charts.compare_chart(rows, tmp_path / "c.png", "H200"))
    assert fig.axes[0].get_yscale() == "log" and "(log scale)" in fig.axes[0].get_title()


def test_the_sweep_chart_on_a_cpu_has_one_row_of_host_times(tmp_path, monkeypatch):
    row = {"axis": "batch", "strategy": "padded", "status": "ok", "batch": 4,
           "capacity": 8, "sigma": "1", "boxes per image": 1.0}
    for key in ("GPU", "elapsed"):
        row.update({f"{key} ms": 1.0, f"{key} p20 ms": 0.9, f"{key} p80 ms": 1.1})
    cpu = _drawn(monkeypatch, lambda: charts.sweep_chart([row], tmp_path / "s.png", "here", "cpu"))
    titles = [ax.get_title() for ax in cpu.axes]
    assert titles and not any("GPU" in t for t in titles)
    assert all(t.startswith("host") for t in titles)
    assert charts.CPU_NOTE in cpu._suptitle.get_text()
    gpu = _drawn(monkeypatch, lambda: charts.sweep_chart([row], tmp_path / "s.png", "here", "gpu"))
    assert len(gpu.axes) == 2 * len(cpu.axes)


def test_the_sweep_chart_takes_a_quantile_past_its_median_by_a_rounding(tmp_path,
                                                                        monkeypatch):
    """A GPU's sweep drew p20 = median + 8.7e-19 ms (identical timings, interpolated):
    matplotlib refuses a negative error bar, and the sweep failed at its chart."""
    row = {"axis": "batch", "strategy": "padded", "status": "ok", "batch": 256,
           "capacity": 256, "sigma": "3", "boxes per image": 3.0}
    for key in ("GPU", "elapsed"):
        row.update({f"{key} ms": 0.00736, f"{key} p20 ms": 0.00736 + 8.7e-19,
                    f"{key} p80 ms": 0.00736 - 1e-19})
    fig = _drawn(monkeypatch, lambda: charts.sweep_chart([row], tmp_path / "s.png", "here", "gpu"))
    assert len(fig.axes) == 2 * len(charts.AXIS_TITLES)


def test_a_refused_flag_names_the_make_variable(tmp_path):
    done = cli("--out-dir", str(tmp_path), "--loss", "nope")
    assert done.returncode == 2
    assert "argument --loss: invalid choice: 'nope'" in done.stderr
    assert "(make's LOSS=)" in done.stderr


def test_a_cpu_runs_summary_says_not_measured_as_null(tmp_path):
    """summary.json recorded 0.0 for every phase's gpu_ms, launches and syncs and for the
    step's gpu_ms on a CPU: a reader could not tell 'not measured' from zero."""
    import json
    done = cli("--out-dir", str(tmp_path))
    assert done.returncode == 0, done.stderr[-2000:]
    (run,) = tmp_path.iterdir()
    summary = json.loads((run / "summary.json").read_text())
    for phase in summary["phases"].values():
        assert phase["cpu_ms"] > 0
        assert [phase[k] for k in ("gpu_ms", "launches", "h2d_copies", "syncs")] == [None] * 4
    assert summary["step"]["cpu_ms"] > 0 and summary["step"]["gpu_ms"] is None
    assert summary["step"]["busy_ms"] is None and summary["top_kernels"] == []
