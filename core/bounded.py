"""A call that may never return, given a bound: on a daemon thread, waited for at most so
long. Where a process must end whatever a library's teardown does (a gloo group freed
beside a dead peer, TensorBoard's writer closed after a Ctrl-C lost its thread's wakeup),
the caller decides what to do past the bound; the daemon thread never holds the
interpreter's exit."""

import threading


def finished_within(call, seconds: float, name: str) -> bool:
    """call() on a daemon thread named `name`, joined for `seconds` at most: whether it
    returned (or raised) in that time."""
    worker = threading.Thread(target=call, daemon=True, name=name)
    worker.start()
    worker.join(seconds)
    return not worker.is_alive()
