"""make sweep: a tiny sweep writes its CSV, Markdown and chart with every strategy and axis;
the byte counts match a hand computation; the boxes per image follow the distribution
asked for; a failing point is a row that says so, never a point of a curve."""

import csv
import math

import pytest
import torch

from core.names import describe, variants
from studies import sweep, sweep_point
from studies.sweep_report import slope
from tests.helpers import ONE_CPU_COMPILER

TINY = ["--batch", "2,4", "--capacity", "8,16", "--sigma", "3,full", "--boxes-capacity", "8",
        "--rep-ms", "2"]


def _rows(out):
    return list(csv.DictReader((out / "sweep.csv").open()))


@ONE_CPU_COMPILER
def test_a_tiny_sweep_writes_every_strategy_and_axis(tmp_path, capsys):
    out = tmp_path / "sweep"
    assert sweep.main(["--out", str(out), *TINY]) == 0
    for name in ("sweep.csv", "sweep.md", "sweep.png"):
        assert (out / name).stat().st_size > 0, name
    rows = _rows(out)
    names = {describe(*(s.split(":") + ["triton"])[:2]) for s in variants()}
    assert {r["strategy"] for r in rows} == names
    assert {r["axis"] for r in rows} == {"batch", "capacity", "boxes"}
    for r in rows:
        if r["status"] == "ok":
            for t in ("GPU", "elapsed"):
                assert float(r[f"{t} p20 ms"]) <= float(r[f"{t} ms"]) <= float(r[f"{t} p80 ms"])
            assert int(r["bytes"]) > 0
        else:  # only what cannot run here
            assert r["status"].startswith("left out") and "cuda" in r["strategy"] and \
                not torch.cuda.is_available(), r
    full = [r for r in rows if r["axis"] == "boxes" and r["sigma"] == "full"
            and r["status"] == "ok"]
    assert full and all(float(r["boxes per image"]) == 8 for r in full)
    text = (out / "sweep.md").read_text()
    assert "## Against batch size" in text and "## conditional against kernel" in text
    if not torch.cuda.is_available():
        assert "the times mean nothing" in text
    assert "[1/" in capsys.readouterr().out  # a progress line per point


def test_byte_counts_match_a_hand_computation(tmp_path):
    out = tmp_path / "sweep"
    assert sweep.main(["--out", str(out), *TINY, "--strategies",
                           "padded,conditional:triton,concat"]) == 0
    point = {r["strategy"]: r for r in _rows(out) if r["axis"] == "batch" and r["batch"] == "2"}
    valid = int(point["padded"]["valid boxes"])
    pred = 2 if torch.cuda.is_available() else 4  # bf16 on a GPU, fp32 on a CPU
    # Batch 2, M 16 (the centre's capacity): predictions [2, 16, 4], uint8 targets, int32
    # counts. Forward and backward each read the boxes and counts; the backward writes
    # the gradient [2, 16, 4].
    grad = 2 * 16 * 4 * pred
    assert int(point["padded"]["bytes"]) == 2 * (2 * 16 * 4 * (pred + 1) + 2 * 4) + grad
    assert int(point["conditional/triton"]["bytes"]) == 2 * (valid * 4 * (pred + 1) + 8) + grad
    assert int(point["concat"]["bytes"]) == 2 * valid * 4 * (pred + 1) + grad
    assert sweep_point.layout_bytes("kernel", 1024, 256, 1961, 2, 1, 4) == \
        2 * (1024 * 256 * 12 + 4096) + 1024 * 256 * 8


@pytest.mark.parametrize("sigma,capacity", [(3.0, 255), (10.0, 16), (300.0, 1024)])
def test_boxes_per_image_follow_the_distribution_asked_for(sigma, capacity):
    """n = min(floor(sigma |Z|), M): E[n] = sum_k P(sigma |Z| >= k) = sum_k erfc(k / (sigma
    sqrt 2)) for k = 1..M."""
    n = [b.shape[0] for _, b in sweep_point.samples(3000, capacity, sigma, seed=5)]
    expected = sum(math.erfc(k / (sigma * math.sqrt(2))) for k in range(1, capacity + 1))
    mean = sum(n) / len(n)
    spread = (sum((x - mean) ** 2 for x in n) / len(n)) ** 0.5
    assert abs(mean - expected) < 4 * spread / math.sqrt(len(n)) + 1e-9, (mean, expected)
    assert max(n) <= capacity
    full = sweep_point.samples(5, capacity, math.inf, seed=5)
    assert all(b.shape[0] == capacity for _, b in full)


def test_a_failing_point_is_a_row_and_the_sweep_goes_on(tmp_path, monkeypatch, capsys):
    real = sweep.measure

    def measure(loss, backend, batch, *args, **kwargs):
        if loss == "padded" and batch == 4:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 GiB")
        return real(loss, backend, batch, *args, **kwargs)

    monkeypatch.setattr(sweep, "measure", measure)
    out = tmp_path / "sweep"
    assert sweep.main(["--out", str(out), *TINY, "--strategies", "padded,concat"]) == 1
    rows = _rows(out)
    failed = [r for r in rows if r["status"].startswith("failed")]
    # batch 4 is on every axis (the centre): every padded row there failed, nothing else.
    assert failed and all(r["strategy"] == "padded" and r["batch"] == "4" for r in failed)
    assert all("out of memory" in r["status"] and r["GPU ms"] == "" for r in failed)
    assert all(r["status"] == "ok" for r in rows if r not in failed)
    assert "failed: CUDA out of memory" in (out / "sweep.md").read_text()
    assert "points failed" in capsys.readouterr().out
    # The chart drawn again from the CSV alone (its failed rows still left out).
    (out / "sweep.png").unlink()
    assert sweep.main(["--redraw", str(out)]) == 0
    assert (out / "sweep.png").stat().st_size > 0
    # Its title names the device and commit sweep.md recorded, not this machine's now.
    from profiling.environment import environment
    env = environment()
    assert sweep._where_measured(out) == \
        f"{env['device']}, commit {(env['commit'] or '')[:7] or 'not recorded'}"
    assert sweep._where_measured(tmp_path).endswith("sweep.md names no device")
    assert sweep.main(["--redraw", str(tmp_path)]) == 2
    assert "no sweep.csv in" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    (["--batch", "x"], "--batch takes a comma-separated list of numbers"),
    (["--sigma", "0"], "--sigma values must be positive"),
    (["--strategies", "padded,bogus"], "unknown strategy 'bogus'"),
    (["--sigma", "nan"], "--sigma values must be positive"),
    (["--batch", "4,-2"], "--batch values must be positive"),
    (["--boxes-capacity", "-1"], "--boxes-capacity must be at least 1"),
    (["--rep-ms", "-5"], "--rep-ms must be at least 1"),
    (["--strategies", ""], "--strategies"),
    (["--strategies", "padded,kernel,kernel:triton"], "--strategies names kernel/triton twice"),
    (["--strategies", "nested:cuda"], "nested has no kernel backend: write nested, not "
                                      "nested:cuda"),
])
def test_bad_options_are_one_line(tmp_path, capsys, args, message):
    assert sweep.main(["--out", str(tmp_path / "x"), *args]) == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_redrawing_a_csv_that_is_not_a_sweeps_is_one_line(tmp_path, capsys):
    (tmp_path / "sweep.csv").write_text("a,b\n1,2\n")
    assert sweep.main(["--redraw", str(tmp_path)]) == 2
    assert "is not a sweep's table (no column 'axis')" in capsys.readouterr().err


def test_ctrl_c_keeps_the_points_measured(tmp_path, monkeypatch):
    real, calls = sweep.measure, []

    def measure(*args, **kwargs):
        calls.append(1)
        if len(calls) == 3:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(sweep, "measure", measure)
    out = tmp_path / "sweep"
    with pytest.raises(sweep.StudyInterrupted, match="sweep-interrupted \\(2 points measured\\)"):
        sweep.main(["--out", str(out), *TINY, "--strategies", "padded"])
    assert [p.name for p in tmp_path.iterdir()] == ["sweep-interrupted"]
    kept = tmp_path / "sweep-interrupted"
    assert len(_rows(kept)) == 2 and (kept / "sweep.md").read_text().startswith("**Interrupted**")
    # Before any point: nothing is left.
    calls.clear()
    calls.extend([1, 1])
    with pytest.raises(sweep.StudyInterrupted, match="nothing kept"):
        sweep.main(["--out", str(tmp_path / "again"), *TINY, "--strategies", "padded"])
    assert not (tmp_path / "again").exists()


def test_each_round_gets_the_gpu_work_its_call_launched():
    """sweep_point.per_round on a made-up trace of two rounds: the call's kernels are its
    GPU time, the copy's memcpy counts as its H2D copy only, and work launched outside
    every range is nobody's."""
    def rng(name, ts, dur):
        return {"ph": "X", "cat": "user_annotation", "name": name, "ts": ts, "dur": dur}

    def api(name, ts, corr):
        return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": 1,
                "args": {"correlation": corr}}

    def gpu(cat, name, dur, corr):
        return {"ph": "X", "cat": cat, "name": name, "ts": 1000, "dur": dur,
                "args": {"correlation": corr}}

    events = [rng("sweep_copy", 0, 10), api("cudaMemcpyAsync", 2, 1),
              rng("sweep_call", 10, 20), api("cudaLaunchKernel", 12, 2),
              api("cudaLaunchKernel", 14, 3),
              rng("sweep_copy", 40, 10), api("cudaMemcpyAsync", 42, 4),
              rng("sweep_call", 50, 20), api("cudaLaunchKernel", 52, 5),
              api("cudaLaunchKernel", 35, 9),  # between the rounds: in no range
              gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 5, 1),
              gpu("kernel", "k", 10, 2), gpu("kernel", "k", 20, 3),
              gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", 5, 4),
              gpu("kernel", "k", 40, 5), gpu("kernel", "k", 100, 9)]
    got = sweep_point.per_round(events, 2)
    assert got["gpu_ms"] == pytest.approx([0.030, 0.040])
    assert got["launches"] == 1.5 and got["h2d"] == 1  # medians of [2, 1] and [1, 1]


def test_slopes_read_growth_on_log_log_axes():
    rows = [{"axis": "batch", "batch": b, "capacity": 8, "GPU ms": 0.5 * b, "status": "ok"}
            for b in (1, 10, 100)]
    assert slope(rows) == pytest.approx(1.0)
    flat = [{**r, "GPU ms": 2.0} for r in rows]
    assert slope(flat) == pytest.approx(0.0)


@pytest.mark.gpu
def test_a_small_sweep_on_the_gpu_times_with_cuda_events(tmp_path):
    out = tmp_path / "sweep"
    assert sweep.main(["--out", str(out), "--batch", "64,256", "--capacity", "256",
                           "--sigma", "3,full", "--boxes-capacity", "256", "--rep-ms",
                           "10"]) == 0
    rows = [r for r in _rows(out) if r["status"] == "ok"]
    assert {r["strategy"] for r in rows} >= {"kernel/cuda", "conditional/cuda",
                                             "kernel/triton", "padded"}
    for r in rows:
        assert r["timer"] == "triton do_bench (CUDA events)"
        assert float(r["launches"]) > 0 and float(r["% of peak"]) > 0
        assert 0 < float(r["GPU ms"]) <= float(r["elapsed ms"]) * 1.5
    fused = [r for r in rows if r["strategy"] == "kernel/cuda"]
    # 2 forward, 1 backward, and autograd's fill of the backward's seed gradient.
    assert all(float(r["launches"]) == 4 for r in fused)
    # The layout's two copies (boxes and counts) per call.
    assert all(float(r["H2D copies"]) == 2 for r in fused)


@pytest.mark.parametrize("module", ["sweep", "compare"])
def test_help_explains_every_option_and_its_default(module, capsys):
    """make sweep ARGS=--help gave no help and no defaults for --batch, --capacity,
    --sigma, --strategies, --seed or --out; compare's said only '--modes comma-separated'."""
    import importlib
    main = importlib.import_module(f"studies.{module}").main
    with pytest.raises(SystemExit):
        main(["--help"])
    text = " ".join(capsys.readouterr().out.split())
    options = ["--strategies", "--out"] + (["--batch", "--capacity", "--sigma", "--seed"]
                                           if module == "sweep" else ["--modes", "--runs"])
    for option in options:
        said = text.split(f"{option} ", 1)[1].split(" --", 1)[0]
        assert len(said.split()) > 3, (option, said)  # more than its metavar
    assert "(default: None)" not in text
    if module == "sweep":
        assert "(default: 0)" in text and "profiles/sweep-<UTC time>/" in text
    else:
        assert "(default: train,forward)" in text and "train.py --help" in text


def test_the_report_prints_no_exponents():
    """sweep.md said '2401 / 2.4e+03'."""
    from studies.sweep_report import _cell
    assert _cell({"status": "ok", "GPU ms": 2401.3, "elapsed ms": 2401.3}) == "2401 / 2401"
    assert _cell({"status": "ok", "GPU ms": 1.23456, "elapsed ms": 0.5}) == "1.235 / 0.5"
