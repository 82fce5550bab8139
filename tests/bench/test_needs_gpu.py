"""The bench tools that time GPU work, on a machine without a CUDA GPU (or told there is
none): --help prints their usage, and a run ends on one line, exit 1, before any CUDA
call (it was a traceback from the first one for five of them)."""

import importlib
import sys

import pytest
import torch

from tests.helpers import REPO

# Every tool that calls the check, read from its source: a tool that adds the call is
# tested without being listed here.
GPU_TOOLS = sorted(p.stem for p in (REPO / "bench").glob("*.py")
                   if p.stem != "needs_gpu" and "require_cuda(" in p.read_text())


def _main(tool: str, argv: list[str], monkeypatch) -> SystemExit:
    module = importlib.import_module(f"bench.{tool}")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(sys, "argv", [f"bench/{tool}.py", *argv])
    with pytest.raises(SystemExit) as ended:
        module.main()
    return ended.value


@pytest.mark.parametrize("tool", GPU_TOOLS)
def test_without_a_gpu_a_run_is_one_line(tool, monkeypatch):
    code = _main(tool, [], monkeypatch).code
    assert isinstance(code, str) and code.startswith("needs a CUDA GPU: "), code
    assert "\n" not in code


@pytest.mark.parametrize("tool", GPU_TOOLS)
def test_help_needs_no_gpu(tool, monkeypatch, capsys):
    assert _main(tool, ["--help"], monkeypatch).code == 0
    assert capsys.readouterr().out.startswith("usage: ")
