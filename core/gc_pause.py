"""Python's cyclic garbage collector paused while a program starts. Importing torch, then
torch._dynamo (torch.optim's first optimizer imports it), makes about half a million
objects that live as long as the process; every full collection on the way walks all of
them and finds no garbage. That walk is about a sixth of a short CPU run's CPU time (a
rank of the test suite's jobs; results/correctness.md has the figures)."""

import gc
from contextlib import contextmanager

_PAUSED_AT_START: dict = {}


def pause_while_importing() -> None:
    """A program's first call, before its imports; imports_done() ends the pause."""
    if gc.isenabled():
        gc.disable()
        _PAUSED_AT_START["paused"] = True


def imports_done() -> None:
    """The program's imports are done: what they made is moved out of every later
    collection's walk (gc.freeze: modules, classes and functions live as long as the
    process anyway), and collection resumes. Nothing where this process did not pause
    at its start (a test importing the program)."""
    if _PAUSED_AT_START.pop("paused", False):
        gc.freeze()
        gc.enable()


@contextmanager
def paused():
    """No automatic collection inside, the state before restored after: for a stretch
    that imports or makes objects that last (a run's model and optimizer). An explicit
    gc.collect() inside still runs."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()
