"""Adding a speed-up is one new file and one line in ORDER (docs/layout.md), nothing else:
in a copy of the tree a probe speed-up, a model transform that leaves the model as it is,
is added that way; train.py --help lists its flag and the registry-wide tests take it in
(in the ladder's order and a flag; off with --baseline; the baseline's loss, gradients
and update; its parameters' names and values; every switch together)."""

from tests.helpers import copy_of_the_tree, python_in
from training.speedups import ORDER, SPEEDUPS

PROBE = '''"""A probe of tests/training/speedups/test_adding_one.py: changes nothing."""

from training.speedups.base import SpeedUp


def unchanged(model, build):
    return None


SPEEDUP = SpeedUp("probe_noop", "changes nothing (a test's probe)", model=unchanged)
'''
# Where a same-maths speed-up goes: after the last one in ORDER, before those that change
# the maths (the ladder's last rungs), as training/speedups/__init__.py spells it.
SAME = [s.name for s in SPEEDUPS if not s.changes_maths][-1]
END = ")" if SAME == ORDER[-1] else ","
LAST = f'"{SAME}"{END}'


def test_a_speedup_is_one_file_and_one_line_in_order(tmp_path):
    tree = copy_of_the_tree(tmp_path)
    (tree / "training" / "speedups" / "probe_noop.py").write_text(PROBE)
    init = tree / "training" / "speedups" / "__init__.py"
    text = init.read_text()
    assert text.count(LAST) == 1, f"{LAST} is not written once in ORDER"
    init.write_text(text.replace(LAST, f'"{SAME}", "probe_noop"{END}'))
    shown = python_in(tree, tmp_path, "train.py", "--help", timeout=120)
    assert shown.returncode == 0 and "--probe-noop" in shown.stdout, shown.stderr[-2000:]
    done = python_in(tree, tmp_path, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-rA",
                     "tests/training/speedups/test_registry.py", "-k",
                     "every_module or baseline_turns or probe_noop or every_switch or "
                     "changes_the_maths")
    assert done.returncode == 0, done.stdout[-3000:]
    passed = [line for line in done.stdout.splitlines() if line.startswith("PASSED")]
    assert sum("probe_noop" in line for line in passed) == 2, passed  # loss and names
    assert any("every_switch_together" in line for line in passed), passed
