"""core/gc_pause.py: a program's imports run with the collector paused, which resumes, with
what they made frozen, when its command starts; a paused stretch puts back the state it
found; a process that did not pause at its start (a test importing a program) is left
alone."""

import gc
import subprocess
import sys

import pytest

from core import gc_pause
from tests.helpers import REPO

# A program as train.py and studies/ start: program_starts() before the imports, then a
# command; it prints the collector's state at each point.
PROGRAM = """
from core.commands import program_starts
program_starts()
import gc
importing = gc.isenabled()
from core.commands import command, run_command

def body(argv):
    print(importing, gc.isenabled(), gc.get_freeze_count() > 0)
    return 0

run_command(command(body), "nothing")
"""


def test_a_programs_imports_pause_the_collector_until_its_command_starts():
    done = subprocess.run([sys.executable, "-c", PROGRAM], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["False", "True", "True"]


@pytest.mark.parametrize("enabled", (True, False))
def test_a_paused_stretch_puts_back_the_state_it_found(enabled):
    was = gc.isenabled()
    (gc.enable if enabled else gc.disable)()
    try:
        with pytest.raises(RuntimeError):
            with gc_pause.paused():
                assert not gc.isenabled()
                raise RuntimeError("the stretch ends early")
        assert gc.isenabled() == enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_imports_done_leaves_a_process_that_did_not_pause_alone():
    frozen = gc.get_freeze_count()
    gc_pause.imports_done()
    assert gc.isenabled() and gc.get_freeze_count() == frozen
