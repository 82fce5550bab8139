"""A pytest plugin that lets several pytest processes share one suite: each test runs in
the first process to reach it, which claims it with a file made with O_EXCL in the folder
CLAIMS_DIR; in the others it is skipped with CLAIMED_ELSEWHERE as its reason. Every
process walks the same tests in the same order, so the long ones spread over the
processes as they come, without a list made beforehand (tests/gpu_suite.py starts them).
Tests marked @pytest.mark.together(name) all run in the process that reaches the first of
them: one process's compiler then serves every test that compiles with Inductor on the
CPU (tests/helpers.ONE_CPU_COMPILER says why).

Skipped in setup, before any fixture of the test: pytest's setup and teardown of modules
and sessions stay as in a plain run."""

import hashlib
import os
from pathlib import Path

import pytest

CLAIMED_ELSEWHERE = "run by another worker of the suite"
_GROUPS_OWNED: set = set()


def claim(folder: Path, nodeid: str) -> bool:
    """Whether this process is the first to claim the test. The claim holds the test's id:
    the runner names the tests still running when it is stopped (gpu_suite.in_flight)."""
    name = hashlib.sha1(nodeid.encode()).hexdigest()
    try:
        fd = os.open(folder / name, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    try:
        os.write(fd, nodeid.encode())
    finally:
        os.close(fd)
    return True


def groups_folder(folder: Path) -> Path:
    """Where the groups' claims lie: beside the tests' (the runner counts and names
    those)."""
    return folder.with_name(folder.name + ".groups")


def owns_group(folder: Path, group: str) -> bool:
    """Whether this process runs the tests marked together(group): the first to claim
    the group does."""
    if group not in _GROUPS_OWNED:
        groups = groups_folder(folder)
        groups.mkdir(exist_ok=True)
        if not claim(groups, group):
            return False
        _GROUPS_OWNED.add(group)
    return True


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    folder = os.environ.get("CLAIMS_DIR")
    if not folder:
        return
    together = item.get_closest_marker("together")
    if together is not None and not owns_group(Path(folder), together.args[0]):
        pytest.skip(CLAIMED_ELSEWHERE)
    if not claim(Path(folder), item.nodeid):
        pytest.skip(CLAIMED_ELSEWHERE)
