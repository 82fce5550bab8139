"""How a rank stopped by SIGTERM tells the user's stop from torchrun's after a failure
(training/job_notes.py), without a process: the notes the launcher's wrapped handler and
close leave, and how long a rank waits for them."""

import time

import pytest

from core.errors import ERRORS_ENV
from training import job_notes


@pytest.fixture
def folder(tmp_path, monkeypatch):
    monkeypatch.setenv(ERRORS_ENV, str(tmp_path))
    monkeypatch.setenv("WORLD_SIZE", "2")
    return tmp_path


def _timed(signal_name):
    start = time.monotonic()
    failure = job_notes.stopped_for_a_failure(signal_name)
    return failure, time.monotonic() - start


def test_a_stop_for_a_failure_is_known_at_once(folder):
    """Before the close note, a rank waited NOTE_WAIT_S for a note that never came."""
    job_notes.note_a_failures_stop(folder)
    failure, took = _timed("SIGTERM")
    assert failure and took < job_notes.NOTE_WAIT_S / 2, took


def test_the_users_signal_noted_first_is_never_a_failure(folder):
    job_notes.note_the_users_signal(folder)
    job_notes.note_a_failures_stop(folder)  # torchrun's close after the user's signal
    assert not (folder / job_notes.STOPPING).exists()
    assert _timed("SIGTERM")[0] is False


def test_a_sigterm_without_a_note_waits_then_reads_as_a_failure(folder):
    failure, took = _timed("SIGTERM")
    assert failure and took >= job_notes.NOTE_WAIT_S, took


def test_ctrl_c_and_one_process_are_never_a_failure(folder, monkeypatch):
    job_notes.note_a_failures_stop(folder)
    assert _timed("")[0] is False  # SIGINT from a terminal: the user's
    monkeypatch.setenv("WORLD_SIZE", "1")
    assert _timed("SIGTERM")[0] is False


def test_a_removed_folder_takes_no_note(tmp_path):
    gone = tmp_path / "gone"
    job_notes.note_a_failures_stop(gone)
    job_notes.note_the_users_signal(gone)
    assert not gone.exists()


def test_the_launcher_wraps_torchruns_close_to_leave_the_note(folder, monkeypatch):
    from torch.distributed.elastic.multiprocessing import api

    from training.launch import note_why_ranks_stop
    monkeypatch.setattr(api.PContext, "close", api.PContext.close)  # restored after
    monkeypatch.setattr(api, "_terminate_process_handler", api._terminate_process_handler)
    note_why_ranks_stop()
    wrapped = api.PContext.close
    note_why_ranks_stop()  # once, however often called
    assert api.PContext.close is wrapped and api._terminate_process_handler.notes

    class Closing(api.PContext):  # only what close itself touches
        def __init__(self):
            self._tail_logs, self.filtered_stdout, self.filtered_stderr = [], None, None

        def _close(self, death_sig, timeout=30):
            self.closed = death_sig

        _start = _poll = pids = lambda self: None
    Closing().close()
    assert (folder / job_notes.STOPPING).exists()


def test_a_stopped_rank_continued_by_the_launcher_is_still_named_stopped(folder):
    """On four NCCL ranks one rank timed out first, the launcher continued the stopped
    rank, and a rank that timed out a moment later found it running: 'rank 0, 2 stopped
    answering: running, but it did not join'. The launcher now leaves a note of each rank
    it found stopped, and peer_stopped reads it."""
    import os
    import signal
    import subprocess
    import sys

    from training.ranks import peer_stopped
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (folder / f"{job_notes.PID}1").write_text(str(sleeper.pid))
        os.kill(sleeper.pid, signal.SIGSTOP)
        while job_notes.process_state(sleeper.pid) not in ("T", "t"):
            time.sleep(0.01)
        job_notes.note_a_failures_stop(folder)  # continues it, noting that it was stopped
        while job_notes.process_state(sleeper.pid) in ("T", "t"):
            time.sleep(0.01)
        assert job_notes.was_stopped(1) and not job_notes.was_stopped(0)
        line = peer_stopped(RuntimeError("wait timeout after 3000ms"), 0, 2)
        assert line.startswith("rank 1 stopped answering: its process is stopped"), line
    finally:
        sleeper.kill()
        sleeper.wait()


@pytest.mark.parametrize("peer_line,expected", [
    ("interrupted (Ctrl-C) at step 4 of 2001", "interrupted (Ctrl-C)"),
    ("interrupted (SIGTERM) at step 4 of 2001", "interrupted (SIGTERM)"),
    ("run failed at step 4 of 2001: a NaN loss", None),
    (None, None),
])
def test_a_peers_end_on_the_users_stop_is_the_users_stop(folder, monkeypatch, peer_line,
                                                          expected):
    """Rank 0 met rank 1's closed socket (rank 1 ended on its Ctrl-C) before its own
    Ctrl-C came, which then came inside its early end and was dropped: it called the job
    failed (1 in 18 rounds of the gloo failure tests under load)."""
    from core.errors import leave_for_launcher
    from training.ranks import the_users_stop
    if peer_line is not None:
        monkeypatch.setenv("RANK", "1")
        assert leave_for_launcher(peer_line)
    assert the_users_stop(0, 2) == expected
    assert the_users_stop(1, 2) is None  # a rank's own line is not a peer's
    job_notes.note_the_users_signal(folder)  # the launcher's note, whatever the peers said
    assert the_users_stop(1, 2) == "interrupted (the launcher got Ctrl-C or SIGTERM)"
