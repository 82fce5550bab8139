"""PyTorch's loader's index queues, each put made with Ctrl-C and SIGTERM held.

multiprocessing.Queue.put takes the queue's threading.Condition in a `with`. Python runs
a signal's handler between bytecodes, so stop_once's KeyboardInterrupt could be raised in
Condition.__enter__ after its lock was taken and before the `with` began: the lock stayed
taken. The loader's shutdown then puts None on that queue, and the main thread waited on
its own lock for ever, its worker polling for the None (a run that never ended after
Ctrl-C). A put never blocks (the queues are unbounded), so a held signal waits
microseconds and is acted on as the put returns."""

from core.signals import stop_signals_held


def hold_signals_in_puts(iterator) -> None:
    """Wraps the puts of a multiprocessing DataLoader iterator's index queues (the main
    thread's only puts); nothing for an iterator without workers."""
    for queue in getattr(iterator, "_index_queues", ()):
        queue.put = _held(queue.put)


def _held(put):
    def held_put(*args, **kwargs):
        with stop_signals_held():
            return put(*args, **kwargs)
    return held_put
