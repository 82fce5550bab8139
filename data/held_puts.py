"""A loader's iterator started with Ctrl-C and SIGTERM held, and each of its index puts.

multiprocessing.Queue.put takes the queue's threading.Condition in a `with`. Python runs
a signal's handler between bytecodes, so stop_once's KeyboardInterrupt could be raised in
Condition.__enter__ after its lock was taken and before the `with` began: the lock stayed
taken. The loader's shutdown then puts None on that queue, and the main thread waited on
its own lock for ever, its worker polling for the None (a run that never ended after
Ctrl-C). A put never blocks (the queues are unbounded), so a held signal waits
microseconds and is acted on as the put returns."""

from core.signals import stop_signals_held


def held_iter(loader):
    """iter(loader) with Ctrl-C and SIGTERM held while PyTorch's loader forks its workers
    (a KeyboardInterrupt amid the forks left a half-made iterator; they start with both
    blocked: core/signals.stop_signals_held), then its index puts held (the module's why)."""
    with stop_signals_held(forks=True):
        batches = iter(loader)
    for queue in getattr(batches, "_index_queues", ()):  # none without workers
        queue.put = _held(queue.put)
    return batches


def _held(put):
    def held_put(*args, **kwargs):
        with stop_signals_held():
            return put(*args, **kwargs)
    return held_put
