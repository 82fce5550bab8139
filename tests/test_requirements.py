"""requirements-cpu.txt resolves against the public package index as a user's machine
sees it (pip --isolated ignores this machine's local wheels and indexes), so a pin that
contradicts what the pinned torch needs cannot come back. --dry-run installs nothing, but
pip reads a wheel's metadata from the wheel itself where the index does not serve it apart
(PEP 658): the index this machine reaches does not, so pip downloads torch's and triton's
wheels, about 800 MB, the suite's one download."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def test_requirements_resolve_on_the_public_index(tmp_path):
    report = tmp_path / "report.json"
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--quiet",
         "--ignore-installed", "--report", str(report), "-r",
         str(REPO / "requirements-cpu.txt")],
        capture_output=True, text=True, timeout=900, env=env, cwd=tmp_path)
    unreachable = ("NewConnectionError", "Failed to establish a new connection",
                   "Temporary failure in name resolution")
    if done.returncode and any(u in done.stderr for u in unreachable) \
            and not os.environ.get("CI"):
        pytest.skip("the public package index cannot be reached from here")
    assert done.returncode == 0, done.stderr[-3000:]
    installed = {p["metadata"]["name"].lower(): p["metadata"]
                 for p in json.loads(report.read_text())["install"]}
    assert installed["torch"]["version"].startswith("2.13.0")
    # The triton chosen is the one torch itself requires, where it requires one.
    pins = [r for r in installed["torch"].get("requires_dist", []) if r.startswith("triton")]
    for pin in pins:
        if "==" in pin:
            assert installed["triton"]["version"] == pin.split("==")[1].split(";")[0].strip()
    assert {"triton", "tensorboard", "torch-tb-profiler", "pytest"} <= set(installed)


def test_hta_resolves_without_its_dependencies(tmp_path):
    """make installs requirements-hta.txt with --no-deps: its pin must exist on the index,
    and what it needs to read a trace must be in requirements-cpu.txt."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    done = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--isolated", "--dry-run", "--quiet",
         "--ignore-installed", "--no-deps", "--report", str(tmp_path / "r.json"), "-r",
         str(REPO / "requirements-hta.txt")],
        capture_output=True, text=True, timeout=300, env=env, cwd=tmp_path)
    if done.returncode and "connection" in done.stderr.lower() and not os.environ.get("CI"):
        pytest.skip("the public package index cannot be reached from here")
    assert done.returncode == 0, done.stderr[-3000:]
    (hta,) = json.loads((tmp_path / "r.json").read_text())["install"]
    assert hta["metadata"]["name"].lower() == "holistictraceanalysis"
    ours = (REPO / "requirements-cpu.txt").read_text().split()
    assert {"pandas", "plotly", "pydot", "pyyaml", "psutil"} <= set(ours)
