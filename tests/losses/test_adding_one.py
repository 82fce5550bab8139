"""Adding a loss strategy is one new file and one line in core/names.py's REGISTRY: in a
copy of the tree a probe strategy (padded's layout and loss under another name) is added
that way and nothing else; train.py --help offers it, and the registry-wide tests take it
in (the float64 reference in every dtype and kind of boxes, empty and full batches, no
sample or no slot, bad shapes, the names' checks). The README's table of the ways is the
one other place that names it, and tests/test_docs_links.py fails until it does."""

from tests.helpers import copy_of_the_tree, python_in

PROBE = '''"""A probe of tests/losses/test_adding_one.py: padded's layout and loss, renamed."""

import dataclasses

from losses import padded


def make(capacity, backend):
    return dataclasses.replace(padded.make(capacity, backend), name="probe")
'''
LAST = ('''    "compiled_packed": Traits("losses.compiled_packed:make", "packed", '''
        '''compiled=True),\n}''')


def test_a_strategy_is_one_file_and_one_line_in_the_registry(tmp_path):
    tree = copy_of_the_tree(tmp_path)
    (tree / "losses" / "probe.py").write_text(PROBE)
    names = tree / "core" / "names.py"
    text = names.read_text()
    assert text.count(LAST) == 1, "REGISTRY's last entry moved: update LAST"
    names.write_text(text.replace(LAST, LAST[:-1] + '    "probe": Traits("losses.probe:make", '
                                  '"padded"),\n}'))
    shown = python_in(tree, tmp_path, "train.py", "--help", timeout=120)
    assert shown.returncode == 0 and "compiled_packed,probe}" in shown.stdout, shown.stderr
    done = python_in(tree, tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                     "tests/losses/test_losses.py", "tests/core/test_names.py", "-k",
                     "probe or test_names")
    assert done.returncode == 0, done.stdout[-3000:]
    passed = [line for line in done.stdout.splitlines() if line.startswith("PASSED")]
    assert sum("probe" in line for line in passed) >= 20, passed
