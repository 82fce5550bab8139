"""make throughput: an epoch per strategy with its window at the end, a time budget for
the ragged ones, and a table of sustained samples/s from the runs' summaries."""

import csv
import json
from pathlib import Path

import pytest

import train
from studies import throughput
from tests.helpers import SMALL, TINY, interrupt_at_run

SHORT = TINY + ["--dataset-length", "40"]  # batch 4: an epoch of 10 steps
# The same without --wait, which TINY sets: the command places the window then.
UNPLACED = [a for i, a in enumerate(SHORT) if "--wait" not in SHORT[max(i - 1, 0):i + 1]]


def test_an_epoch_each_the_window_at_its_end_and_a_budget_for_the_ragged():
    base, given = throughput.base_config(UNPLACED, throughput.PER_RUN, throughput.REFUSAL)
    assert "wait" not in given and base.warmup == 1 and base.active == 2
    assert throughput.run_fields(base, given, "padded", 5.0) == {"steps": 10, "wait": 7}
    assert throughput.run_fields(base, given, "concat", 5.0) == {"steps": 10, "seconds": 5.0}
    base, given = throughput.base_config(UNPLACED + ["--steps", "6"], throughput.PER_RUN,
                                         throughput.REFUSAL)
    assert throughput.run_fields(base, given, "padded", 5.0) == {"wait": 3}
    # A window the user placed stays where it is.
    base, given = throughput.base_config(SHORT, throughput.PER_RUN, throughput.REFUSAL)
    assert throughput.run_fields(base, given, "padded", 5.0) == {"steps": 10}


def test_a_tiny_throughput_table(tmp_path, capsys):
    out = tmp_path / "tp"
    code = throughput.main(["--out", str(out), "--strategies", "padded,loop,kernel:cuda",
                            "--ragged-seconds", "0.5", *SHORT])
    assert code == 0, capsys.readouterr().err
    for name in ("throughput.md", "throughput.csv", "throughput.png", "skipped.json"):
        assert (out / name).exists(), name
    rows = {r["strategy"]: r for r in csv.DictReader((out / "throughput.csv").open())}
    assert rows["padded"]["steps run"] == "10" and rows["padded"]["timer"] == "host wall"
    assert rows["padded"]["loader"] == "ring" and rows["padded"]["copy"] == "in the step"
    assert float(rows["padded"]["sustained samples/s"]) > 0
    assert rows["loop"]["budget"] == "0.5 s" and 3 <= int(rows["loop"]["steps run"]) <= 10
    if not train.torch.cuda.is_available():
        assert rows["kernel/cuda"]["steps run"].startswith("skipped")


def test_options_set_per_run_are_refused(tmp_path, capsys):
    assert throughput.main(["--out", str(tmp_path / "x"), "--loss", "padded", *SHORT]) == 2
    assert "--loss is set per run by make throughput" in capsys.readouterr().err


@pytest.mark.parametrize("args,message", [
    # each was a wrong line, a traceback or a check after the folder
    (["--dataset-length", "8"], "an epoch of --dataset-length 8 at batch 4 is 2 steps, too "
                                "few for the profiled window at its end (3 steps)"),
    (["--ragged-seconds", "nan"], "--ragged-seconds must be a positive number of seconds"),
    (["--strategies", "nested:cuda"], "nested has no kernel backend"),
    (["--out", "/proc/x/y"], "--out /proc/x/y: "),
])
def test_bad_options_are_one_line_before_any_folder(tmp_path, capsys, args, message):
    out = ["--out", str(tmp_path / "x")] if "--out" not in args else []
    assert throughput.main([*out, *UNPLACED, *args]) == 2
    err = capsys.readouterr().err
    assert message in err and "--out-dir" not in err and "Traceback" not in err, err
    assert not (tmp_path / "x").exists()


def test_nothing_that_can_run_here_writes_nothing(tmp_path, capsys, monkeypatch):
    """Every strategy skipped (the CUDA kernels on a CPU): one line with the reasons, no
    folder left to refuse the next make throughput there."""
    monkeypatch.setattr(throughput, "unavailable_reason", lambda: "no CUDA here")
    assert throughput.main(["--out", str(tmp_path / "x"), "--strategies", "kernel:cuda",
                            *SHORT]) == 2
    err = capsys.readouterr().err
    assert "none of the 1 strategies could run here (kernel/cuda: skipped: no CUDA here)" \
        in err
    assert not (tmp_path / "x").exists()


@pytest.mark.gpu
def test_a_small_throughput_table_on_the_gpu(tmp_path, capsys):
    """On the device: the rates come from CUDA events, the GPU's rate from the trace's
    busiest stream, the runs copy ahead from the ring, and steps.png is drawn."""
    out = tmp_path / "tp"
    code = throughput.main(["--out", str(out), "--strategies", "padded,kernel:cuda", *SMALL,
                            "--dataset-length", "1280"])  # batch 64: an epoch of 20 steps
    assert code == 0, capsys.readouterr().err
    assert (out / "steps.png").exists() and (out / "throughput.png").exists()
    rows = {r["strategy"]: r for r in csv.DictReader((out / "throughput.csv").open())}
    for name in ("padded", "kernel/cuda"):
        row = rows[name]
        assert row["steps run"] == "20" and row["timer"].startswith("device")
        assert 0 < float(row["sustained samples/s"]) and 0 < float(row["GPU's rate samples/s"])
        summary = json.loads((out / name.replace("/", "-") / "summary.json").read_text())
        assert summary["batches"]["copy"] == "a step ahead, on a side stream"
        assert summary["batches"]["loader"] == "ring"
        assert summary["data_wait"]["steps"] == 20 - summary["config"]["settle"]
        # rank 0's card sampled beside the run: 18 short steps may fall between two of
        # nvidia-smi's samples, and the summary then says so
        clocks = summary["gpu_clocks"]
        assert clocks.get("samples", 0) > 0 or clocks["unavailable"].startswith("no sample")


def test_ctrl_c_keeps_the_table_of_the_runs_that_finished(tmp_path, monkeypatch):
    from core.errors import StudyInterrupted
    interrupt_at_run(monkeypatch, throughput, 2)
    with pytest.raises(StudyInterrupted) as caught:
        throughput.main(["--out", str(tmp_path / "tp"), "--strategies", "padded,concat",
                         *SHORT])
    kept = tmp_path / "tp-interrupted"
    assert str(caught.value) == f"interrupted (Ctrl-C); kept in {kept} (1 of 2 runs finished)"
    assert (kept / "throughput.md").read_text().startswith("**Interrupted** after 1 of 2")
    rows = list(csv.DictReader((kept / "throughput.csv").open()))
    assert [r["strategy"] for r in rows] == ["padded"]
    assert Path(rows[0]["run folder"]).parent == kept


def test_a_full_disk_names_the_file_and_leaves_a_folder_a_rerun_takes(tmp_path, monkeypatch):
    """ENOSPC while the tables were written gave 'could not write: No
    space left on device', and the skipped.json written first made the folder refuse a
    rerun though it held no table. The line names the file; skipped.json comes last."""
    import errno

    from core.errors import one_line
    from studies import common
    out = tmp_path / "tp"
    out.mkdir()

    def full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")  # a write: no filename

    monkeypatch.setattr(Path, "write_text", full)
    with pytest.raises(OSError) as caught:
        throughput.write_tables(out, [], [{"strategy": "padded", "steps run": "x"}], [])
    monkeypatch.undo()
    assert one_line(caught.value) == (f"could not write {out / 'throughput.md'}: No space "
                                      "left on device (the disk is full)")
    assert not list(out.iterdir())  # no partial file, no skipped.json
    assert common.fresh_out(out, "throughput", "throughput") == out


def test_a_cpu_runs_a_few_steps_unless_told_with_the_window_at_the_start():
    """The CPU preset's epoch is 31,250 steps (hours on 2 cores); its
    runs stop at CPU_STEPS, the window where --wait puts it, so a Ctrl-C keeps it. 138 s
    for the 11 default runs on the 2-core machine (docs/runs.md)."""
    base, given = throughput.base_config(["--preset", "cpu"], throughput.PER_RUN,
                                         throughput.REFUSAL)
    assert throughput.cpu_capped(base, given)
    for loss in ("padded", "loop"):  # no time budget for the ragged ones either
        assert throughput.run_fields(base, given, loss, 30.0) == {"steps": throughput.CPU_STEPS}
    base, given = throughput.base_config(["--preset", "cpu", "--steps", "500"],
                                         throughput.PER_RUN, throughput.REFUSAL)
    assert not throughput.cpu_capped(base, given)


def test_long_runs_print_fewer_progress_lines(monkeypatch):
    """A line a step up to 500 steps; past that the first 20, the window's, the last and
    one every 2 s: 31,250 lines an epoch was too many to read."""
    from profiling import harness
    run = harness.ProfiledRun.__new__(harness.ProfiledRun)
    run.plan = train.plan_of(train.parse_config(["--preset", "cpu", "--wait", "100",
                                                 "--warmup", "1", "--active", "2"]))
    run.window, run._last_line = 103, 0.0
    clock = iter(float(i) * 0.01 for i in range(10**6))
    monkeypatch.setattr(harness.time, "monotonic", lambda: next(clock))
    run.total = 400
    assert all(run._worth_a_line(s) for s in range(400))
    run.total = 31_250
    said = [s for s in range(run.total) if run._worth_a_line(s)]
    assert said[:20] == list(range(20)) and {100, 101, 102, 31_249} <= set(said)
    assert len(said) < 31_250 / 100  # one every 2 s at 10 ms a step, and the above


def test_a_gpu_runs_row_gives_the_models_rate_at_the_sustained_rate(tmp_path):
    """Its TFLOP/s a GPU and MFU are the run's own account (profiling/harness.py), '-'
    without an MFU (a CPU, or a GPU whose peak is unknown)."""
    from studies.throughput import row_of
    summary = {"config": {"loss": "padded", "backend": "triton", "batch_size": 1024},
               "sustained": {"samples_per_s": 47_500.0, "step_ms_median": 21.5,
                             "step_ms_p95": 21.6, "timer": "device"},
               "step": {"busiest_stream_ms": 21.4}, "steps_run": 976,
               "flops": {"tflop": 7.927, "sustained_tflop_per_s": 367.7,
                         "sustained_mfu": 0.3718}}
    row = row_of(summary, tmp_path)
    assert row["TFLOP/s a GPU"] == 367.7 and row["MFU %"] == pytest.approx(37.18)
    summary["flops"]["sustained_mfu"] = None
    row = row_of(summary, tmp_path)
    assert row["TFLOP/s a GPU"] is None and row["MFU %"] is None


def test_a_runs_row_gives_its_clocks_and_what_held_them_down(tmp_path):
    """The SM clock and power medians, and the reason held the most samples (idle is no
    reason under load); nothing where the clocks were not sampled."""
    from studies.throughput import COLUMNS, row_of
    summary = {"config": {"loss": "kernel", "backend": "cuda", "batch_size": 1024},
               "sustained": {"samples_per_s": 50_000.0}, "step": {"busiest_stream_ms": 20},
               "steps_run": 976,
               "gpu_clocks": {"sm_mhz_median": 1754.6, "power_w_median": 689.7,
                              "held_by": {"idle": 0.9, "the power cap": 0.62,
                                          "software thermal": 0.1}}}
    row = row_of(summary, tmp_path)
    assert (row["SM MHz"], row["power W"], row["clock held by"]) == (1755, 690,
                                                                     "the power cap 62 %")
    assert "J a step" not in row  # no energy counter there
    summary["gpu_clocks"]["held_by"] = {"idle": 0.02}
    summary["gpu_clocks"]["joules_per_step"] = 13.276
    row = row_of(summary, tmp_path)
    assert row["clock held by"] == "nothing" and row["J a step"] == 13.28
    assert set(row) <= set(COLUMNS), set(row) - set(COLUMNS)  # every cell has a column
    summary["gpu_clocks"] = {"unavailable": "nvidia-smi did not run"}
    assert "SM MHz" not in row_of(summary, tmp_path)


def test_against_a_table_that_is_not_text_is_one_line(tmp_path):
    """A throughput.csv that is not text gave 30 lines (UnicodeDecodeError)."""
    from core.errors import UserError
    (tmp_path / "throughput.csv").write_bytes(b"\xff\xfe\x00\x81 binary")
    with pytest.raises(UserError, match=r"cannot read throughput.csv as a CSV table "
                                        r"\(UnicodeDecodeError\)"):
        throughput.rates_in(tmp_path)
