"""core/bounded.finished_within: a call given a bound, on a daemon thread."""

import threading
import time

from core.bounded import finished_within


def test_a_call_that_returns_in_time_is_finished():
    done = []
    assert finished_within(lambda: done.append(1), 5.0, "quick")
    assert done == [1]


def test_a_call_past_its_bound_is_left_on_a_daemon_thread():
    release = threading.Event()
    started = time.monotonic()
    assert not finished_within(release.wait, 0.2, "stuck")
    assert 0.2 <= time.monotonic() - started < 5.0
    stuck = [t for t in threading.enumerate() if t.name == "stuck"]
    assert len(stuck) == 1 and stuck[0].daemon  # never holds the interpreter's exit
    release.set()
    stuck[0].join(5.0)
    assert not stuck[0].is_alive()


def test_a_call_that_raises_has_finished(monkeypatch):
    def fails():
        raise RuntimeError("teardown failed")
    seen = []  # the thread's excepthook reports it; the caller only learns it has ended
    monkeypatch.setattr(threading, "excepthook", lambda args: seen.append(args.exc_value))
    assert finished_within(fails, 5.0, "raises")
    assert [str(e) for e in seen] == ["teardown failed"]
