"""Every way a run can end early ends with one line, a non-zero exit, and a run folder
that says what it holds: the profiled steps that completed, gzipped and summarized, in
<name>-interrupted or <name>-failed; or no folder when nothing was worth keeping."""

import json
import signal

import pytest

import train
from core.errors import RunFailed
from tests.helpers import TINY, make_every_loss_nan, signal_after, start_long_run


@pytest.mark.parametrize("signum,name", [(signal.SIGINT, "Ctrl-C"), (signal.SIGTERM, "SIGTERM")])
def test_a_signal_in_the_profiled_steps_keeps_the_completed_ones(tmp_path, signum, name):
    code, lines = signal_after(start_long_run(tmp_path), "step 5/401 (profiled)", signum)
    assert code == 130, lines
    assert len(lines) == 1 and lines[0].startswith(f"error: interrupted ({name}) at step "), lines
    assert [p.name for p in tmp_path.iterdir()] == ["run-interrupted"], lines
    kept = tmp_path / "run-interrupted"
    summary = json.loads((kept / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["planned_steps"] == 401
    done = summary["completed_steps"]
    assert summary["steps"] == done - 1  # the warmup step is not a profiled one
    assert f"holds the {done - 1} profiled steps that completed" in lines[0]
    assert len(summary["phases"]["loss"]["cpu_ms_each"]) == done - 1
    assert "interrupted after" in summary["table"]
    assert len(list(kept.glob("*.pt.trace.json.gz"))) == 1


def test_a_signal_before_any_profiled_step_leaves_nothing(tmp_path):
    args = ["--wait", "400", "--warmup", "1", "--active", "1"]
    code, lines = signal_after(start_long_run(tmp_path, *args), "step 2/402 (wait)", signal.SIGINT)
    assert code == 130 and len(lines) == 1, lines
    assert lines[0].startswith("error: interrupted (Ctrl-C) at step ") and \
        lines[0].endswith("; nothing kept"), lines
    assert not list(tmp_path.iterdir())


class _Broken(Exception):
    pass


def _break_dataset_at(monkeypatch, index):
    import data.synthetic
    real = data.synthetic.SyntheticFaces.__getitem__

    def getitem(self, i):
        if i >= index:
            raise _Broken(f"sample {i} could not be made")
        return real(self, i)
    monkeypatch.setattr(data.synthetic.SyntheticFaces, "__getitem__", getitem)


@pytest.mark.parametrize("workers", ("0", "1"))
def test_an_error_in_the_data_keeps_the_profiled_steps_and_the_traceback(
        tmp_path, monkeypatch, workers):
    _break_dataset_at(monkeypatch, 12)  # batches of 4: steps 1-3 complete, step 4 fails
    args = TINY + ["--out-dir", str(tmp_path), "--run-name", "run", "--num-workers", workers,
                   "--active", "5"]
    with pytest.raises(RunFailed) as failed:
        train.run(train.parse_config(args))
    message = str(failed.value)
    assert message.startswith("run failed at step 4 of 6: ") and "sample 12 could not be made" \
        in message, message
    assert message.endswith("run-failed holds the 2 profiled steps that completed"), message
    kept = tmp_path / "run-failed"
    summary = json.loads((kept / "summary.json").read_text())
    assert summary["status"] == "failed" and summary["steps"] == 2
    assert "sample 12 could not be made" in summary["reason"]
    assert "_Broken" in (kept / "error.txt").read_text()
    assert [p.name for p in tmp_path.iterdir()] == ["run-failed"]


@pytest.mark.parametrize("where", ["writer", "profiler"])
def test_a_signal_as_the_run_starts_leaves_no_folder(tmp_path, monkeypatch, where):
    """A SIGTERM between the folder's making and the end of ProfiledRun.__enter__ (the
    writer's start, the profiler's) left an empty, unmarked folder: no __exit__ follows
    an __enter__ that raised (1 of 150 moments of a short run's life, under load)."""
    import torch.utils.tensorboard

    import profiling.harness

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt("SIGTERM")
    if where == "writer":
        monkeypatch.setattr(torch.utils.tensorboard, "SummaryWriter", interrupted)
    else:
        monkeypatch.setattr(profiling.harness, "make_profiler", interrupted)
    with pytest.raises(KeyboardInterrupt):
        train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path), "--run-name", "run"]))
    assert list(tmp_path.iterdir()) == []


def test_a_bug_before_any_profiled_step_keeps_only_its_traceback(tmp_path, monkeypatch):
    _break_dataset_at(monkeypatch, 0)
    with pytest.raises(RunFailed) as failed:
        train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path), "--run-name", "run"]))
    assert str(failed.value).endswith("traceback in " + str(tmp_path / "run-failed" / "error.txt"))
    kept = tmp_path / "run-failed"
    assert sorted(p.name for p in kept.iterdir() if not p.name.startswith("events")) == \
        ["error.txt", "index.html", "summary.json"]
    assert json.loads((kept / "summary.json").read_text())["status"] == "failed"


def test_a_failed_trace_write_leaves_nothing_half_written(tmp_path, monkeypatch):
    import profiling.trace_writer

    def disk_full(run_dir, worker="*"):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(profiling.trace_writer, "gzip_traces", disk_full)
    with pytest.raises(RunFailed) as failed:
        train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path), "--run-name", "run"]))
    # The write named no file: the run's folder, where it was writing, is named.
    assert str(failed.value) == (f"run failed after step 3 of 3: could not write "
                                 f"{tmp_path / 'run'}: No space left on device (the disk is "
                                 "full); nothing kept")
    assert not list(tmp_path.iterdir())


def test_a_non_finite_loss_stops_the_run(tmp_path, monkeypatch):
    make_every_loss_nan(monkeypatch)
    with pytest.raises(RunFailed, match="run failed at step 1 of 3: the loss is nan at step 1"):
        train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path)]))
    (kept,) = tmp_path.iterdir()
    assert kept.name.endswith("-failed")  # a bug's traceback is kept, marked failed


def test_a_signal_while_a_run_ends_keeping_nothing_says_so():
    """A SIGTERM relayed by make while a run ended early with no profiled step said it was
    'received while the run's folder is written', though nothing was kept."""
    import os
    import signal

    from core.signals import stop_signals_held
    lines = []
    with stop_signals_held(act=False, say=lines.append, what=None):
        os.kill(os.getpid(), signal.SIGTERM)
    assert lines == ["SIGTERM received while the run ends early: it keeps nothing (no "
                     "profiled step completed)"]


def test_a_signal_as_the_run_starts_to_end_still_marks_its_folder(tmp_path, monkeypatch):
    """torchrun's SIGTERM reaches rank 0 while rank 0 is already ending on its peer's
    death. Landing in the first lines of the run's exit, before its signals were held,
    the KeyboardInterrupt escaped the exit and left the folder unmarked (`job`, no
    summary: tests/training/test_launch.py saw it once in 8 killed-rank jobs under load). Here the
    signal is sent at that very point, every time."""
    import os

    import core.signals
    import profiling.harness
    from core.signals import STOP_SIGNALS, stop_once
    monkeypatch.setattr(core.signals, "_STOPPED", [])  # the signal is this test's alone
    real = profiling.harness.ProfiledRun.profiled_done
    sent = []

    def profiled_done(self):
        if not sent:  # the first call is __exit__'s own, before it holds the signals
            sent.append(signal.SIGTERM)
            os.kill(os.getpid(), signal.SIGTERM)  # its handler raises here
        return real(self)
    monkeypatch.setattr(profiling.harness.ProfiledRun, "profiled_done", profiled_done)
    _break_dataset_at(monkeypatch, 12)  # steps 1-3 complete, step 4 fails
    before = {signum: signal.getsignal(signum) for signum in STOP_SIGNALS}
    stop_once()
    try:
        with pytest.raises(KeyboardInterrupt) as ended:
            train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path), "--run-name",
                                                 "run", "--active", "5"]))
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    assert sent and "run-interrupted holds the 2 profiled steps" in str(ended.value), ended
    assert [p.name for p in tmp_path.iterdir()] == ["run-interrupted"]
    summary = json.loads((tmp_path / "run-interrupted" / "summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["steps"] == 2


def test_an_early_end_outlasts_a_scalar_writer_that_never_closes(tmp_path, monkeypatch):
    """A Ctrl-C inside TensorBoard's add_scalar can leave its writer's close() waiting two
    minutes (profiling/profiler_setup.close_within): the early end goes on without it."""
    import time

    import torch.utils.tensorboard
    real = torch.utils.tensorboard.SummaryWriter.close
    monkeypatch.setattr(torch.utils.tensorboard.SummaryWriter, "close",
                        lambda self: time.sleep(30) or real(self))
    make_every_loss_nan(monkeypatch)
    start = time.monotonic()
    with pytest.raises(RunFailed, match="the loss is nan at step 1"):
        train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path)]))
    assert time.monotonic() - start < 15
    (kept,) = tmp_path.iterdir()
    assert kept.name.endswith("-failed")


def test_kinetos_line_about_a_folder_gone_read_only_is_dropped(tmp_path, monkeypatch, capfd):
    """The folder turned read-only between the check before the trace's write and kineto's
    open (a CI run): kineto's ERROR line went out beside the run's one line. It is taken
    aside and dropped, and the write ends on an OSError naming the folder; what kineto
    says of a write that went well still reaches stderr."""
    import os

    from profiling.profiler_setup import _into_writable
    writable = [True]
    real = os.access
    monkeypatch.setattr(os, "access", lambda path, mode: writable[0] and real(path, mode))

    def remounted_as_it_writes(prof):
        writable[0] = False
        os.write(2, b"ERROR:... output_json.cpp:466] Failed to open '...': Read-only\n")
    with pytest.raises(OSError) as refused:
        _into_writable(tmp_path, remounted_as_it_writes)(None)
    assert refused.value.filename == str(tmp_path)
    assert capfd.readouterr().err == ""

    writable[0] = True
    _into_writable(tmp_path, lambda prof: os.write(2, b"a warning of kineto's\n"))(None)
    assert capfd.readouterr().err == "a warning of kineto's\n"
