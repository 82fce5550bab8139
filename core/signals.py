"""The two signals that end a run (Ctrl-C's SIGINT, and SIGTERM): raised once as a
KeyboardInterrupt, raised again where some code swallowed it, held while a piece of work
must not be cut, and ignored once nothing should cut the process's work short."""

import contextlib
import faulthandler
import os
import signal
import sys
import threading

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
_STOPPED: list[int] = []  # the stop signal that stop_once raised, if one came


def ignore_stop_signals() -> None:
    """Ignore Ctrl-C and SIGTERM from now on (handlers can be set from the main thread
    only; elsewhere this does nothing)."""
    if threading.current_thread() is threading.main_thread():
        for signum in STOP_SIGNALS:
            signal.signal(signum, signal.SIG_IGN)


def note_stop_signals() -> None:
    """From now on Ctrl-C and SIGTERM are only noted (stop_signal() names the first), never
    raised: for a command that has its code and is leaving, where a KeyboardInterrupt
    printed a traceback among the interpreter's exit callbacks, and where ignoring them
    let a successful command exit 0 after one (core.commands.leave makes that 130)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def note(signum, frame):
        if not _STOPPED:
            _STOPPED.append(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, note)


def stop_once() -> None:
    """Ctrl-C and SIGTERM end the run as a KeyboardInterrupt ("SIGTERM" for SIGTERM), once:
    the first one raises, and any further one is dropped (a second one escaped the run's
    early end and left the profiler half stopped). C extension modules imported from now
    on start with both held (_hold_as_extensions_start)."""
    if threading.current_thread() is not threading.main_thread():
        return

    def dropped(signum, frame):
        pass

    def first(signum, frame):
        for stop in STOP_SIGNALS:
            signal.signal(stop, dropped)
        # From here on a child's death is the signal's doing (it reaches the whole group):
        # PyTorch's SIGCHLD handler must not raise "worker killed by signal" inside the
        # early end. A no-op handler, not SIG_DFL, for a SIGCHLD already pending.
        if hasattr(signal, "SIGCHLD"):  # POSIX
            signal.signal(signal.SIGCHLD, _child_ended)
        _STOPPED.append(signum)
        raise _interrupt(signum)

    for signum in STOP_SIGNALS:
        signal.signal(signum, first)
    stacks_on_sigusr2()
    _hold_as_extensions_start()
    if sys.unraisablehook is not _unraisable:
        _UNRAISABLE[:] = [sys.unraisablehook]
        sys.unraisablehook = _unraisable


def stacks_on_sigusr2() -> None:
    """kill -USR2 <pid>: every thread's Python stack on stderr, and the process goes on.
    faulthandler writes them from C, so this answers where a stop signal's handler never
    runs: a main thread inside a call that does not come back to Python (a CUDA call whose
    kernel waits, a hung compile), the case a user needs to see."""
    if not hasattr(signal, "SIGUSR2"):  # not POSIX
        return
    try:
        faulthandler.register(signal.SIGUSR2, all_threads=True)
    except (OSError, ValueError):  # a stderr with no file descriptor (captured): none
        pass


def _hold_as_extensions_start() -> None:
    """From now on every C extension module starts (its init and exec, the ones
    ExtensionFileLoader runs) with Ctrl-C and SIGTERM held; they act as it returns. Some
    run Python as they start: triton 3.9's (nanobind's) makes enums. stop_once's
    KeyboardInterrupt raised there was swallowed (the import went on, the signal lost) or
    became a C++ exception that nothing caught: the process aborted (SIGABRT, "terminate
    called after throwing an instance of 'nanobind::python_error'"). The loader's class,
    not a finder on sys.meta_path: torch.utils.cpp_extension loads its builds from a spec
    it makes itself, which no finder sees."""
    from importlib.machinery import ExtensionFileLoader
    for name in ("create_module", "exec_module"):
        start = getattr(ExtensionFileLoader, name)
        if not getattr(start, "held", False):
            setattr(ExtensionFileLoader, name, _held(start))


def _held(start):
    def held(loader, arg):
        with stop_signals_held():
            return start(loader, arg)
    held.held = True
    return held


_UNRAISABLE: list = []  # the unraisable hook stop_once found, for everything but its own


def _unraisable(unraisable) -> None:
    """stop_once's KeyboardInterrupt raised where Python cannot raise (a weakref's callback,
    a finalizer, an at-fork callback) is not printed as "Exception ignored in ...": its
    signal is noted, and raise_if_stopped raises it again where the run can end. Nor,
    after a stop signal, is a half-made object's finalizer, or one that joins its own
    thread. Everything else goes to the hook stop_once found."""
    if _STOPPED and (wrapped_interrupt(unraisable.exc_value) is not None
                     or _half_made(unraisable) or joined_itself(unraisable)):
        return
    (_UNRAISABLE[0] if _UNRAISABLE else sys.__unraisablehook__)(unraisable)


def _half_made(unraisable) -> bool:
    """A __del__ that met an attribute its __init__ never set: the trace of an __init__
    that the stop signal's KeyboardInterrupt cut short (PyTorch's StorageWeakRef, made as a
    batch's shared storage arrives, then has no _free_weak_ref)."""
    return (isinstance(unraisable.exc_value, AttributeError)
            and getattr(unraisable.object, "__name__", None) == "__del__")


def joined_itself(unraisable) -> bool:
    """A finalizer that joined the thread it ran on: PyTorch's rendezvous keep-alive timer
    (elastic's _PeriodicTimer) sets its stop event, then joins its thread. As a stop
    signal unwinds the launcher, that thread can hold the handler's last reference (a
    keep-alive in flight), so the finalizer runs there and the join raises; the event is
    set, so the thread ends all the same (a CI at 92f2ab6: "cannot join current thread"
    under the launcher's one line)."""
    return (isinstance(unraisable.exc_value, RuntimeError)
            and str(unraisable.exc_value) == "cannot join current thread")


def wrapped_interrupt(exc: BaseException | None) -> KeyboardInterrupt | None:
    """The KeyboardInterrupt (a Ctrl-C or SIGTERM) that exc was raised from or while
    handling, if any: Python 3.11 wraps what a __set_name__ raises (a cached_property's,
    as a module is imported) in a RuntimeError, and code that raises its own error `from
    None` over that keeps the interrupt only in the context."""
    seen: list[BaseException] = []
    while exc is not None and all(exc is not e for e in seen):
        if isinstance(exc, KeyboardInterrupt):
            return exc
        seen.append(exc)
        exc = exc.__cause__ or exc.__context__
    return None


def _child_ended(signum, frame) -> None:
    """SIGCHLD after a stop signal: a child's end is that signal's doing, not news."""


def _interrupt(signum: int) -> KeyboardInterrupt:
    return KeyboardInterrupt("SIGTERM" if signum == signal.SIGTERM else "")


def stop_signal() -> str | None:
    """The name of the stop signal that stop_once raised or note_stop_signals noted
    ("SIGTERM", "Ctrl-C"), if one came."""
    return _name(_STOPPED[0]) if _STOPPED else None


def _name(signum: int) -> str:
    return "Ctrl-C" if signum == signal.SIGINT else signal.Signals(signum).name


def raise_if_stopped() -> None:
    """Raises stop_once's KeyboardInterrupt again if its signal came: called where a run
    goes on as if none had (each step's start, a run's end). Python raises a handler's
    exception wherever the main thread is, and some places swallow it (an at-fork
    callback as the loader's workers fork, a finalizer): the run exited 0 after it."""
    if _STOPPED:
        raise _interrupt(_STOPPED[0])


@contextlib.contextmanager
def stop_signals_held(act: bool = True, say=None, what: str | None = "the run's files",
                      forks: bool = False):
    """Ctrl-C and SIGTERM that arrive inside are held and acted on at the end (act=False:
    dropped, for a run already ending). say(line): told once when the first one arrives,
    that `what` is being written and kept (None: that the run is ending and keeps
    nothing). forks: the block forks data workers, which start with both signals blocked
    (unblock_stop_signals, once a worker has its own handlers).

    Python-level handlers that only take note, not pthread_sigmask alone: a signal
    blocked in the main thread goes to another thread, and was lost."""
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return
    held = []

    def hold(signum, _frame):
        if not held and say is not None:
            name = _name(signum)
            if what is None:
                say(f"{name} received while the run ends early: it keeps nothing (no "
                    "profiled step completed)")
            else:
                say(f"{name} received while {what} is written: held until it is, so that "
                    "nothing is cut short (kill -9 would discard it)")
        held.append(signum)

    previous = {signum: signal.signal(signum, hold)
                for signum in STOP_SIGNALS}
    mask = _block_for_children() if forks else None
    try:
        yield
    finally:
        if mask is not None:  # one that came meanwhile runs `hold` as this returns
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        for signum, handler in previous.items():
            if signal.getsignal(signum) is hold:  # not where a rank chose to ignore them
                signal.signal(signum, handler)
        if held and act:
            handler = previous[held[0]]
            if callable(handler):
                handler(held[0], None)  # Ctrl-C's KeyboardInterrupt, train.py's SIGTERM
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), held[0])


def _block_for_children():
    """Blocks Ctrl-C and SIGTERM in this thread, so that a child forked now starts with
    them blocked; the old mask (None where there is no such call). Before a data worker
    has its own handlers, a SIGTERM to the group killed it, and PyTorch's SIGCHLD handler
    raised "worker killed by signal" inside the loader's start. A signal for this process
    still reaches `hold`: through another thread, or pending until the mask is back."""
    if not hasattr(signal, "pthread_sigmask"):
        return None
    return signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)


def unblock_stop_signals() -> None:
    """Unblocks Ctrl-C and SIGTERM in a child forked under stop_signals_held(forks=True),
    once its own handlers are set: one sent meanwhile is delivered to them now."""
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)
