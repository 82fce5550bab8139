"""core/waits.py: a wait for the device ends when the work does, and a signal ends it even
when the work never does (a collective whose peer died, under NCCL)."""

import signal
import time

import pytest

from core.waits import POLL_S, wait_for


class _Event:
    """Done after `after` queries (None: never)."""

    def __init__(self, after):
        self.after, self.queries = after, 0

    def query(self) -> bool:
        self.queries += 1
        return self.after is not None and self.queries > self.after


def test_it_returns_once_the_work_is_done():
    event = _Event(after=3)
    wait_for(event)
    assert event.queries == 4
    done = _Event(after=0)
    wait_for(done)
    assert done.queries == 1  # done already: no sleep


class _Stopped(Exception):
    pass


def test_a_signal_ends_a_wait_whose_work_never_ends():
    def stop(signum, frame):
        raise _Stopped
    old = signal.signal(signal.SIGALRM, stop)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.05)
        started = time.monotonic()
        with pytest.raises(_Stopped):
            wait_for(_Event(after=None))
        # The handler ran within a poll or so of the signal (generous for a loaded machine).
        assert time.monotonic() - started < 0.05 + 100 * POLL_S + 1.0
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


def test_a_bounded_wait_ends_in_a_timeout_worded_as_the_collectives_are():
    from core.waits import set_bound
    from training.ranks import TIMED_OUT
    set_bound(0.05)
    try:
        started = time.monotonic()
        with pytest.raises(TimeoutError) as raised:
            wait_for(_Event(after=None))
        assert 0.05 <= time.monotonic() - started < 0.05 + 1.0
        assert any(word in str(raised.value).lower() for word in TIMED_OUT), raised.value
        wait_for(_Event(after=3))  # work that ends within the bound: no error
    finally:
        set_bound(None)
