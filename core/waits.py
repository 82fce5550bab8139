"""A wait for the device that a signal can end: CUDA's blocking waits (an event's
synchronize) sit in C until the work is done, where Python's signal handlers cannot run.
Under NCCL a peer that died leaves this rank's collective, and so every later kernel of its
stream, waiting forever: torchrun's SIGTERM then went unanswered until its SIGKILL 30 s
later. Polled in short sleeps, the handler runs between two of them.

Nothing here imports torch: the event is anything with query()."""

import time

POLL_S = 0.0002  # 0.2 ms: small beside a step of ~20 ms, and the host is steps ahead


def wait_for(event) -> None:
    """Returns once event.query() is true (a CUDA event: its work done); a signal's
    handler runs within POLL_S."""
    while not event.query():
        time.sleep(POLL_S)
