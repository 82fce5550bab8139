"""core/signals.py in this process: a stop signal whose KeyboardInterrupt was swallowed is
raised again; a held one comes through at the end."""

import faulthandler
import os
import signal

import pytest

from core import signals


@pytest.fixture
def stop_once_here(monkeypatch):
    """stop_once's handlers for this test, this process's own put back after it."""
    import sys
    monkeypatch.setattr(signals, "_STOPPED", [])
    kept = {s: signal.getsignal(s) for s in (*signals.STOP_SIGNALS, signal.SIGCHLD)}
    monkeypatch.setattr(sys, "unraisablehook", sys.unraisablehook)  # put back after
    signals.stop_once()
    yield
    for signum, handler in kept.items():
        signal.signal(signum, handler)
    faulthandler.unregister(signal.SIGUSR2)


def _swallowing(signum):
    """What an at-fork callback or a finalizer does to a KeyboardInterrupt."""
    try:
        os.kill(os.getpid(), signum)
    except KeyboardInterrupt:
        pass


@pytest.mark.parametrize("signum,name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_swallowed_stop_signal_is_raised_again(stop_once_here, signum, name):
    signals.raise_if_stopped()  # none came: nothing
    _swallowing(signum)
    assert signals.stop_signal() == name
    with pytest.raises(KeyboardInterrupt) as raised:
        signals.raise_if_stopped()
    assert str(raised.value) == ("SIGTERM" if signum == signal.SIGTERM else "")
    _swallowing(signum)  # a second signal is dropped, the first still stands
    with pytest.raises(KeyboardInterrupt):
        signals.raise_if_stopped()


def test_a_stop_signal_in_a_finalizer_prints_nothing_and_is_raised_again(stop_once_here,
                                                                         monkeypatch):
    """A SIGTERM that lands in a finalizer or a weakref's callback (importlib's module
    lock, the 50-moment loop) was printed as "Exception ignored in ..."; now it is quiet
    and raise_if_stopped raises it. Any other unraisable error still reaches the hook."""
    import gc
    import sys
    seen = []
    monkeypatch.setattr(signals, "_UNRAISABLE", [lambda u: seen.append(u.exc_value)])

    class Finalized:
        def __del__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here, unraisable
            raise ValueError("a finalizer's own error")  # not reached

    Finalized()
    gc.collect()
    assert seen == [] and signals.stop_signal() == "SIGTERM"
    with pytest.raises(KeyboardInterrupt):
        signals.raise_if_stopped()

    class Failing:
        def __del__(self):
            raise ValueError("a finalizer's own error")

    Failing()
    gc.collect()
    assert [str(e) for e in seen] == ["a finalizer's own error"]
    assert sys.unraisablehook is signals._unraisable


def test_the_finalizer_of_an_object_a_stop_signal_left_half_made_prints_nothing(
        stop_once_here, monkeypatch):
    """PyTorch's StorageWeakRef, made as a batch's shared storage arrives: a SIGTERM in its
    __init__ left it without _free_weak_ref, and its __del__'s AttributeError was printed
    under the run's one line. Before any stop signal such an error reaches the hook."""
    import gc
    seen = []
    monkeypatch.setattr(signals, "_UNRAISABLE", [lambda u: seen.append(u.exc_value)])

    class HalfMade:
        def __init__(self):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here
            self.free = None

        def __del__(self):
            del self.free  # as StorageWeakRef.__del__ reads its _free_weak_ref

    HalfMade.__new__(HalfMade)  # no signal yet: its error is reported
    gc.collect()
    assert [type(e) for e in seen] == [AttributeError]
    with pytest.raises(KeyboardInterrupt):
        HalfMade()
    gc.collect()
    assert len(seen) == 1 and signals.stop_signal() == "SIGTERM"


def _a_finalizer_that_joins_its_own_thread() -> None:
    """What PyTorch's rendezvous timer does when its thread drops the last reference."""
    import threading
    import weakref

    class Timer:
        pass

    def run():
        timer = Timer()
        weakref.finalize(timer, threading.Thread.join, threading.current_thread())
        del timer  # the finalizer runs here, on the thread it joins

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()


def test_a_finalizer_that_joins_its_own_thread_after_a_stop_signal_prints_nothing(
        stop_once_here, monkeypatch):
    """The launcher's rendezvous keep-alive timer, its last reference dropped on its own
    thread as a SIGTERM unwound the launcher: "cannot join current thread" was printed
    under the one line. Before any stop signal it reaches the hook."""
    seen = []
    monkeypatch.setattr(signals, "_UNRAISABLE", [lambda u: seen.append(u.exc_value)])
    _a_finalizer_that_joins_its_own_thread()
    assert [str(e) for e in seen] == ["cannot join current thread"]
    _swallowing(signal.SIGTERM)
    _a_finalizer_that_joins_its_own_thread()
    assert len(seen) == 1 and signals.stop_signal() == "SIGTERM"


def test_a_stop_signal_python_wrapped_in_a_finalizer_prints_nothing(stop_once_here,
                                                                    monkeypatch):
    """The same signal whose handler ran inside a cached_property's __set_name__, in a
    finalizer: Python 3.11 hands the hook a RuntimeError raised from the interrupt, and
    it printed its traceback (make compare's 56 lines, the 50-moment loop's round 20)."""
    import functools
    import gc
    seen = []
    monkeypatch.setattr(signals, "_UNRAISABLE", [lambda u: seen.append(u.exc_value)])

    class Signalled(functools.cached_property):
        def __set_name__(self, owner, name):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler raises here

    class Finalized:
        def __del__(self):
            type("Made", (), {"x": Signalled(lambda self: 1)})

    Finalized()
    gc.collect()
    assert seen == [] and signals.stop_signal() == "SIGTERM"


def test_a_stop_signal_leaves_childrens_deaths_unannounced(stop_once_here):
    signal.signal(signal.SIGCHLD, lambda *_: pytest.fail("SIGCHLD handler ran"))
    _swallowing(signal.SIGTERM)
    handler = signal.getsignal(signal.SIGCHLD)
    assert callable(handler) and handler.__name__ == "_child_ended"
    os.kill(os.getpid(), signal.SIGCHLD)  # runs it: nothing raised, nothing printed


def test_a_held_signal_comes_through_at_the_end(stop_once_here):
    with pytest.raises(KeyboardInterrupt):
        with signals.stop_signals_held():
            os.kill(os.getpid(), signal.SIGTERM)
            seen = "held"  # reached: the signal did not cut the block
    assert seen == "held" and signals.stop_signal() == "SIGTERM"


def test_a_signal_that_python_wrapped_is_still_an_interruption(capsys):
    """Python 3.11 wraps what a __set_name__ raises in a RuntimeError: a SIGTERM whose
    handler ran inside a cached_property's __set_name__ (a module imported 2 s into make
    compare's life) printed 56 lines of traceback. A command's main and train.main now
    see the KeyboardInterrupt it came from."""
    import functools

    import train
    from core.commands import command
    from core.signals import wrapped_interrupt

    class Interrupting(functools.cached_property):
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt("SIGTERM")

    def body(argv):
        type("Made", (), {"x": Interrupting(lambda self: 1)})

    try:
        body(None)
    except BaseException as exc:  # noqa: BLE001 (whatever this Python raises)
        made = exc
    assert isinstance(wrapped_interrupt(made), KeyboardInterrupt)
    assert wrapped_interrupt(RuntimeError("a bug")) is None
    try:  # a compiler's own error raised `from None` over it: the context keeps it
        try:
            body(None)
        except RuntimeError:
            raise ValueError("the compiler's") from None
    except ValueError as exc:
        assert isinstance(wrapped_interrupt(exc), KeyboardInterrupt)
    with pytest.raises(KeyboardInterrupt):
        command(body)([])

    def run(cfg):
        body(None)
    import unittest.mock
    kept = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    try:  # train.main sets this process's handlers: pytest's are put back
        with unittest.mock.patch.object(train, "run", run):
            assert train.main(["--preset", "cpu"]) == 130
    finally:
        for signum, handler in kept.items():
            signal.signal(signum, handler)
    assert capsys.readouterr().err.strip().splitlines() == ["error: interrupted (SIGTERM)"]


def test_a_stop_signal_as_a_c_extension_starts_acts_once_it_has():
    """A SIGTERM while a C extension module starts acts once it has started
    (signals._hold_as_extensions_start): triton 3.9's (nanobind's) runs Python as it starts,
    and a KeyboardInterrupt raised there was swallowed or aborted the process. Here the
    signal comes inside triton's C++ module's start, with Python run after it as nanobind
    runs it, in a fresh interpreter; without the hold the interrupt cuts that Python short."""
    import subprocess
    import sys
    import textwrap
    from pathlib import Path
    pytest.importorskip("triton")
    code = textwrap.dedent("""
        import os, signal
        from importlib.machinery import ExtensionFileLoader
        from core import signals
        started = []
        real_start = ExtensionFileLoader.create_module

        def start(loader, spec):  # the module's start, as the import machinery calls it
            if spec.name == "triton._C.libtriton":
                os.kill(os.getpid(), signal.SIGTERM)
                started.append(sum(range(1000)))  # Python run as the module starts
                module = real_start(loader, spec)
                started.append(module.__name__)
                return module
            return real_start(loader, spec)

        ExtensionFileLoader.create_module = start
        signals.stop_once()
        try:
            import triton
            print("not interrupted")
        except KeyboardInterrupt as exc:
            print("interrupted", repr(exc), "after its start:", started)
    """)
    done = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).parents[2],
                          capture_output=True, text=True, timeout=120)
    assert done.stdout.strip() == ("interrupted KeyboardInterrupt('SIGTERM') after its "
                                   "start: [499500, 'triton._C.libtriton']"), done.stderr[-2000:]


def test_sigusr2_prints_every_threads_stack_and_the_process_goes_on():
    """After stop_once, kill -USR2 <pid> shows where each thread is (before, SIGUSR2's
    default action ended a single run; only several ranks answered it)."""
    import subprocess
    import sys

    from tests.helpers import REPO
    script = """
import os, signal, threading, time
from core.signals import stop_once
stop_once()
def beside():
    time.sleep(30)
threading.Thread(target=beside, daemon=True).start()
time.sleep(0.1)
os.kill(os.getpid(), signal.SIGUSR2)
print("went on", flush=True)
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stdout) == (0, "went on\n"), done.stderr
    assert "Current thread" in done.stderr and " in beside" in done.stderr, done.stderr
