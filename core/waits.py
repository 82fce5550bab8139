"""A wait for the device that a signal can end: CUDA's blocking waits sit in C, where
Python's signal handlers cannot run, and a dead NCCL peer leaves them waiting forever;
polled in short sleeps, the handler runs between two. set_bound ends a wait on a stopped
or hung peer in a TimeoutError. Nothing here imports torch. The design in full:
docs/design.md, this module's section."""

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
