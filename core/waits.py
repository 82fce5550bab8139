"""A wait for the device that a signal can end: CUDA's blocking waits (an event's
synchronize) sit in C until the work is done, where Python's signal handlers cannot run.
Under NCCL a peer that died leaves this rank's collective, and so every later kernel of its
stream, waiting forever: torchrun's SIGTERM then went unanswered until its SIGKILL 30 s
later. Polled in short sleeps, the handler runs between two of them.

A peer that is stopped (SIGSTOP, a debugger) or hung, not dead, leaves the same wait with
no signal to end it: set_bound makes each wait end in a TimeoutError instead
(--hang-timeout on NCCL ranks; training/ranks.set_hang_timeout). NCCL's own watchdog would
abort the process from a thread of its own, printing its logs, with no line for the user.

Nothing here imports torch: the event is anything with query()."""

import time

POLL_S = 0.0002  # 0.2 ms: small beside a step of ~20 ms, and the host is steps ahead
_BOUND_S: list[float | None] = [None]  # set_bound's; None: as long as the work takes


def set_bound(seconds: float | None) -> None:
    """From now on each wait_for raises TimeoutError once it has waited `seconds` (None:
    no bound, the default)."""
    _BOUND_S[0] = seconds


def wait_for(event) -> None:
    """Returns once event.query() is true (a CUDA event: its work done); a signal's
    handler runs within POLL_S. Past set_bound's seconds: TimeoutError, worded as the
    collectives' own timeouts are ("timed out waiting"), since under NCCL only a
    collective that a peer never joined keeps a stream's work from ending."""
    bound = _BOUND_S[0]
    started = time.monotonic()
    while not event.query():
        if bound is not None and time.monotonic() - started > bound:
            raise TimeoutError(f"timed out waiting {bound:g} s for this GPU's work to end "
                               "(--hang-timeout): a collective another rank never joined")
        time.sleep(POLL_S)
