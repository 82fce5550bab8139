"""A stop signal that arrives while the main thread puts an index on a loader worker's queue
(data/held_puts.py): its KeyboardInterrupt comes as the put returns, the queue's lock is
free, and the loader's shutdown ends. Without the hold the lock stays taken."""

import os
import signal
import threading

import pytest
import torch

from data.held_puts import held_iter


class _SignalOnceTaken(threading.Condition):
    """The queue's condition as an unlucky signal finds it: the lock just taken, the
    `with` not yet begun (Python runs the handler as os.kill returns)."""

    def __enter__(self):
        taken = super().__enter__()
        self.__class__ = threading.Condition  # once
        os.kill(os.getpid(), signal.SIGINT)
        return taken


@pytest.fixture
def ctrl_c_raises():
    """SIGINT's KeyboardInterrupt, as in a terminal (a suite started in the background
    inherits it ignored)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.mark.parametrize("held", [True, False])
def test_a_signal_inside_an_index_put_leaves_the_queue_free(ctrl_c_raises, held):
    loader = torch.utils.data.DataLoader(range(64), batch_size=2, num_workers=1)
    batches = held_iter(loader) if held else iter(loader)
    lock = batches._index_queues[0]._notempty
    lock.__class__ = _SignalOnceTaken
    with pytest.raises(KeyboardInterrupt):
        next(batches)  # its index put after the batch arrives
    free = lock.acquire(timeout=2)
    # Ours, or (not free) the interrupted put's, on which the shutdown would wait for ever.
    lock.release()
    assert free == held
    batches._shutdown_workers()  # puts None for the worker, joins it
    assert not any(w.is_alive() for w in batches._workers)
