"""make compare: the side-by-side table comes from the runs' summaries, a rebuild from the
run folders gives the same table, and the counts agree with a real GPU trace."""

import json
import os
from pathlib import Path

import pytest

import train
from studies import common, compare
from studies.compare_rows import compare_rows, load_summary
from tests.helpers import FIXTURES, REPO, TINY, interrupt_at_run


def test_compare_runs_then_rebuilds_the_same_table(tmp_path, capsys):
    out = tmp_path / "cmp"
    assert compare.main(["--out", str(out), "--strategies", "loop,padded,kernel:cuda",
                                "--modes", "forward", *TINY]) == 0
    table = (out / "comparison.md").read_text()
    for name in ("comparison.csv", "comparison.png", "skipped.json"):
        assert (out / name).exists(), name
    assert list((out / "comparison").glob("events.out.tfevents.*"))
    # Its page, the last line's path, links each run's own page.
    assert capsys.readouterr().out.strip().splitlines()[-1] == \
        f"page: {out / 'index.html'} (open it in a browser)"
    page = (out / "index.html").read_text()
    assert "href='loop-forward/index.html'" in page and "comparison.png" in page
    assert (out / "loop-forward" / "index.html").exists()

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

    # A rebuild goes into a new folder and never touches the comparison it came from.
    rebuilt = tmp_path / "rebuilt"
    assert compare.main(["--runs", str(out / "loop-forward"), str(out / "padded-forward"),
                                "--out", str(rebuilt)]) == 0
    assert (rebuilt / "comparison.md").read_text() == table
    assert (out / "comparison.md").read_text() == table
    # Only the given runs, and skipped rows of their modes only.
    single = tmp_path / "single"
    assert compare.main(["--runs", str(out / "padded-forward"), "--out", str(single)]) == 0
    rows = (single / "comparison.md").read_text()
    assert "| padded | forward |" in rows and "| loop |" not in rows
    # An existing comparison is never overwritten.
    assert compare.main(["--runs", str(out / "padded-forward"), "--out", str(single)]) == 2
    assert "already holds a comparison" in capsys.readouterr().err


def test_every_row_names_its_run_folder(tmp_path):
    out = tmp_path / "cmp"
    assert compare.main(["--out", str(out), "--strategies", "padded", "--modes",
                                "train", *TINY]) == 0
    assert str(out / "padded-train") in (out / "comparison.csv").read_text()


def test_two_commands_on_one_out_folder_cannot_both_write(tmp_path):
    """Two make compare (or ladder, sweep, throughput) started together with one --out:
    the second stops with one line before it measures anything."""
    from core.errors import UserError
    first = common.fresh_out(tmp_path / "shared", "comparison", "compare")
    with pytest.raises(UserError, match="is being written by another make compare \\(pid "):
        common.fresh_out(tmp_path / "shared", "comparison", "compare")
    assert first == tmp_path / "shared"
    # Another kind of study may share the folder (a ladder beside a comparison).
    common.fresh_out(tmp_path / "shared", "ladder", "ladder")


def test_a_claim_whose_command_was_killed_is_taken_over(tmp_path, capsys):
    """kill -9 of make compare or make throughput leaves its claim: the next
    command on that folder takes it over with a line, as long as the claimer is gone."""
    import signal
    import subprocess
    import sys

    from core.errors import UserError
    folder = tmp_path / "shared"
    code = (f"import sys; sys.path.insert(0, {str(REPO)!r}); from studies import common; "
            f"common.fresh_out(__import__('pathlib').Path({str(folder)!r}), 'comparison', "
            "'compare'); print('claimed', flush=True); import time; time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "claimed"
    with pytest.raises(UserError, match=f"being written by another make compare \\(pid "
                                        f"{proc.pid} "):
        common.fresh_out(folder, "comparison", "compare")  # alive: refused
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert common.fresh_out(folder, "comparison", "compare") == folder
    err = capsys.readouterr().err
    assert f"taking over {folder}: the make compare that claimed it (pid {proc.pid} " in err
    assert (folder / ".comparison-claimed").read_text().startswith(f"pid {os.getpid()} ")


def test_a_full_disk_is_one_line_and_leaves_no_result_file(tmp_path, capsys, monkeypatch):
    """ENOSPC while the comparison is written: one line naming the cause, exit 1, no
    comparison.md (empty or partial) to block the folder, which is removed, as it was
    made by the command and holds nothing."""
    import errno
    from pathlib import Path
    out = tmp_path / "cmp"
    assert compare.main(["--out", str(out), "--strategies", "padded", "--modes", "forward",
                         *TINY]) == 0
    real = Path.write_text

    def full(self, *args, **kwargs):
        if self.name.endswith(".partial"):
            real(self, "half", **{k: v for k, v in kwargs.items() if k != "data"})
            raise OSError(errno.ENOSPC, "No space left on device", str(self))
        return real(self, *args, **kwargs)
    monkeypatch.setattr(Path, "write_text", full)
    again = tmp_path / "again"
    capsys.readouterr()
    assert compare.main(["--runs", str(out / "padded-forward"), "--out", str(again)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: could not write ")
    assert err[0].endswith("No space left on device (the disk is full)")
    assert not again.exists()
    monkeypatch.undo()
    assert compare.main(["--runs", str(out / "padded-forward"), "--out", str(again)]) == 0


@pytest.mark.parametrize("given", [True, False])
def test_a_signal_after_the_folder_is_made_leaves_no_folder(tmp_path, monkeypatch, given):
    """A Ctrl-C or SIGTERM between a study's making its folder and its own early end (the
    try around its runs) left that folder empty and unmarked: make compare, 1 of 100
    moments of the 50-moment loop under load. The command's end removes it."""
    from core.commands import command
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "cmp" if given else None
    made = []

    def body(argv):
        made.append(common.fresh_out(out, "comparison", "compare"))
        raise KeyboardInterrupt("SIGTERM")  # before the study's own try
    with pytest.raises(KeyboardInterrupt):
        command(body)()
    assert made and not made[0].exists()


def test_two_comparisons_in_the_same_second_get_their_own_folders(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(common, "utc_stamp", lambda: "20260101-000000")
    first = common.fresh_out(None, "comparison", "compare")
    second = common.fresh_out(None, "comparison", "compare")
    assert first != second and first.parent == second.parent == tmp_path / "profiles"


@pytest.mark.parametrize("option,value,field", [
    ("--loss", "padded", "--loss"), ("--backend", "cuda", "--backend"),
    ("--kernel", "cuda", "--backend"), ("--mode", "train", "--mode"),
    ("--run-name", "x", "--run-name"), ("--out-dir", "x", "--out-dir")])
def test_options_that_would_make_every_run_the_same_are_refused(tmp_path, capsys, option,
                                                                value, field):
    assert compare.main(["--out", str(tmp_path / "x"), option, value, *TINY]) == 2
    assert f"{field} is set per run by make compare" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


@pytest.mark.parametrize("option", ["--los", "--out-d"])
def test_an_abbreviated_option_cannot_slip_past_the_refusals(tmp_path, capsys, option):
    assert compare.main(["--out", str(tmp_path / "x"), option, "padded", *TINY]) == 2
    assert f"unrecognized arguments: {option} padded" in capsys.readouterr().err
    assert not (tmp_path / "x").exists()


def test_failed_runs_make_a_non_zero_exit(tmp_path, capsys):
    out = tmp_path / "cmp"
    code = compare.main(["--out", str(out), "--strategies", "padded", "--modes",
                                "forward", *TINY, "--max-boxes", "1", "--batch-size", "16"])
    assert code == 1
    assert "1 of 1 runs failed" in capsys.readouterr().err
    assert "the run failed: sample" in (out / "comparison.md").read_text()


def test_a_run_that_ended_early_is_refused(tmp_path, capsys):
    early = tmp_path / "x-interrupted"
    early.mkdir()
    (early / "summary.json").write_text(json.dumps(
        {"status": "interrupted", "reason": "interrupted (Ctrl-C)", "config": {"mode": "train"}}))
    assert compare.main(["--runs", str(early), "--out", str(tmp_path / "c")]) == 2
    assert "holds a run that interrupted" in capsys.readouterr().err


def test_unknown_strategy_is_refused(tmp_path, capsys):
    assert compare.main(["--out", str(tmp_path / "x"), "--strategies", "fast"]) == 2
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
    assert compare.loop_steps({}) == {"warmup": 1, "active": 2}
    assert compare.loop_steps(train.given_options(["--active", "5"])) == {"warmup": 1}
    assert compare.loop_steps(train.given_options(TINY)) == {}


def _fixture_run(folder: Path, name: str, **config) -> Path:
    """A run folder holding the H100 fixture's summary, its config changed by `config`."""
    summary = load_summary(FIXTURES / "gpu_padded_train.summary.json")
    summary["config"].update(config)
    (folder / name).mkdir(parents=True)
    (folder / name / "summary.json").write_text(json.dumps(summary))
    return folder / name


def test_unlike_runs_are_set_apart_by_columns_and_a_warning(tmp_path, capsys):
    """A loop at batch 32, padded at 32 and at 64: the batch is a column, the table opens
    with a warning, and only the run alike with the loop gets a speed-up over it."""
    runs = [_fixture_run(tmp_path, "loop", loss="loop"),
            _fixture_run(tmp_path, "padded-32"),
            _fixture_run(tmp_path, "padded-64", batch_size=64)]
    out = tmp_path / "cmp"
    assert compare.main(["--runs", *map(str, runs), "--out", str(out)]) == 0
    err = capsys.readouterr().err
    assert "warning: these runs differ in batch (columns of their own)" in err
    table = (out / "comparison.md").read_text()
    assert table.startswith("warning: these runs differ in batch")
    header = next(line for line in table.splitlines() if line.startswith("| strategy"))
    assert header.startswith("| strategy | mode | batch | profiled steps |")
    rows = {(r["strategy"], r["batch"]): r for r in compare_rows(
        [load_summary(r) for r in runs])}
    assert rows[("padded", 32)]["loss speed-up vs loop"] == pytest.approx(1.0)
    assert rows[("padded", 64)]["loss speed-up vs loop"] is None


def test_runs_alike_get_no_warning_and_no_extra_columns(tmp_path, capsys):
    runs = [_fixture_run(tmp_path, "loop", loss="loop"), _fixture_run(tmp_path, "padded")]
    assert compare.main(["--runs", *map(str, runs), "--out", str(tmp_path / "cmp")]) == 0
    assert "warning" not in capsys.readouterr().err
    assert (tmp_path / "cmp" / "comparison.md").read_text().startswith(
        "| strategy | mode | profiled steps |")


@pytest.mark.parametrize("field,value,column", [
    ("image_size", 128, "image size"), ("max_boxes", 64, "capacity"),
    ("amp", False, "amp"), ("cudnn_benchmark", True, "speed-ups asked")])
def test_each_unlike_field_is_named(tmp_path, capsys, field, value, column):
    runs = [_fixture_run(tmp_path, "a"), _fixture_run(tmp_path, "b", **{field: value})]
    assert compare.main(["--runs", *map(str, runs), "--out", str(tmp_path / "cmp")]) == 0
    assert f"differ in {column} (columns" in capsys.readouterr().err


def test_the_same_run_given_twice_is_refused(tmp_path, capsys):
    first, second = _fixture_run(tmp_path, "a"), _fixture_run(tmp_path, "b")
    assert compare.main(["--runs", str(first), str(second), str(first),
                         "--out", str(tmp_path / "cmp")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{first} and {second} are the same kind of run (padded, " \
        "train mode, the same settings): give one of them" in err[0]
    assert not (tmp_path / "cmp").exists()


def test_ctrl_c_keeps_a_comparison_of_the_runs_that_finished(tmp_path, monkeypatch):
    from core.errors import StudyInterrupted
    calls = interrupt_at_run(monkeypatch, compare, 2, "SIGTERM")
    out = tmp_path / "cmp"
    with pytest.raises(StudyInterrupted) as caught:
        compare.main(["--out", str(out), "--strategies", "padded,concat", "--modes",
                      "forward", *TINY])
    kept = tmp_path / "cmp-interrupted"
    assert str(caught.value) == f"interrupted (SIGTERM); kept in {kept} (1 of 2 runs finished)"
    table = (kept / "comparison.md").read_text()
    assert table.startswith("**Interrupted** after 1 of 2 runs")
    assert "| padded | forward |" in table and "| concat |" not in table
    assert str(kept / "padded-forward") in (kept / "comparison.csv").read_text()
    assert not list(kept.glob(".*-claimed"))
    # Before any run finished: a folder this command made is removed.
    calls[:] = ["x"]
    with pytest.raises(StudyInterrupted, match="; nothing kept$"):
        compare.main(["--out", str(tmp_path / "again"), "--strategies", "padded",
                      "--modes", "forward", *TINY])
    assert not (tmp_path / "again").exists()


def test_ctrl_c_leaves_an_existing_out_folder_its_name(tmp_path, monkeypatch):
    """A --out that existed may hold another command's work: it is not renamed, and its
    table says the comparison was interrupted."""
    from core.errors import StudyInterrupted
    interrupt_at_run(monkeypatch, compare, 2)
    out = tmp_path / "shared"
    out.mkdir()
    (out / "ladder.md").write_text("another command's\n")
    with pytest.raises(StudyInterrupted, match=f"kept in {out} \\(1 of 2 runs finished\\)"):
        compare.main(["--out", str(out), "--strategies", "padded,concat", "--modes",
                      "forward", *TINY])
    assert (out / "comparison.md").read_text().startswith("**Interrupted**")
    assert (out / "ladder.md").read_text() == "another command's\n"


def test_a_real_full_disk_is_one_line_per_run_and_no_result_file(tmp_path, capsys):
    """make compare on a small tmpfs: each run's failure is one line saying the disk is
    full, no traceback; no comparison.md (empty or cut short) is left to block the
    folder."""
    from tests.helpers import nearly_full_disk
    with nearly_full_disk(tmp_path / "disk") as disk:
        code = compare.main(["--out", str(disk / "cmp"), "--strategies", "padded,concat",
                             "--modes", "forward", *TINY])
        err = capsys.readouterr().err
        assert code == 1, err
        assert "Traceback" not in err, err
        assert err.count("(the disk is full)") >= 2, err
        assert not (disk / "cmp" / "comparison.md").exists()


@pytest.mark.parametrize("text,says", [
    ('{"status": "complete", "con', "is not JSON (Unterminated string"),
    ("", "is not JSON (it is empty: truncated?)"),
    ("[1, 2]", "holds a JSON list, not an object"),
    ('{"status": "complete", "config": {"mode": "train"}}', "is not a complete run's summary"),
])
def test_runs_with_a_bad_summary_are_one_line(tmp_path, capsys, text, says):
    """A truncated, empty or wrongly typed summary.json gave 21-33 lines of traceback."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "summary.json").write_text(text)
    assert compare.main(["--runs", str(run), "--out", str(tmp_path / "c")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --runs: ") and says in err[0], err
    assert str(run / "summary.json") in err[0]
    (run / "summary.json").write_bytes(b"\xff\xfe\x00binary")
    assert compare.main(["--runs", str(run), "--out", str(tmp_path / "c")]) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: --runs: {run / 'summary.json'} is not text"]


def test_a_studys_progress_line_estimates_the_time_left(monkeypatch):
    """make compare gave no idea of its whole run's time: each run's line now does, at
    the pace of the runs so far."""
    import time
    monkeypatch.setattr(time, "time", lambda: 1000.0)
    assert common.progress("[1/24] padded train", 1000.0, 0, 24) == \
        "[1/24] padded train (0 s so far)"
    assert common.progress("[3/24] loop train", 960.0, 2, 24) == \
        "[3/24] loop train (40 s so far; about 7 min left at this pace)"
    assert common.progress("[24/24] nested forward", 977.0, 23, 24) == \
        "[24/24] nested forward (23 s so far; about 1 s left at this pace)"
