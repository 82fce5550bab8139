"""The two signals that end a run (Ctrl-C's SIGINT, and SIGTERM), and ignoring them once
nothing should cut the process's work short."""

import signal
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def ignore_stop_signals() -> None:
    """Ignore Ctrl-C and SIGTERM from now on (handlers can be set from the main thread
    only; elsewhere this does nothing)."""
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)
