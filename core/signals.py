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


def stop_once() -> None:
    """Ctrl-C and SIGTERM end the run as a KeyboardInterrupt ("SIGTERM" for SIGTERM), once:
    the first one raises, and any further one until the run has ended is dropped. Two
    Ctrl-Cs back to back (a fresh-clone CI run under load) used to raise twice: the
    second escaped the run's early-end handling as a bare "interrupted", left the
    profiler half stopped, and the interpreter died by SIGSEGV at exit. The harness holds
    the signals of its own file writing itself (profiling/harness.py)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def dropped(signum, frame):
        pass

    def first(signum, frame):
        for stop in STOP_SIGNALS:
            signal.signal(stop, dropped)
        raise KeyboardInterrupt("SIGTERM" if signum == signal.SIGTERM else "")

    for signum in STOP_SIGNALS:
        signal.signal(signum, first)
