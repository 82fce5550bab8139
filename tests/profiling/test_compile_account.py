"""profiling/compile_account.py: the compiler's own account of a run (compiles,
recompiles with the guard that failed, graph breaks, compile time), on CPU; Dynamo's
eager backend keeps it fast where only Dynamo's bookkeeping is tested."""

import json

import torch

import train
from profiling import compile_account
from tests.helpers import ONE_CPU_COMPILER, TINY


def _ragged(x, n):
    y = (x.sin() * 2).sum()
    if n > 100:  # Dynamo guards on a Python int: n = 1 and n = 200 are two graphs
        y = y + 1
    print(end="")  # a graph break: Dynamo cannot trace print
    return y


def test_recompiles_are_counted_with_the_guard_that_failed():
    torch._dynamo.reset()
    since = compile_account.begin()
    fn = torch.compile(_ragged, backend="eager", dynamic=False)
    for rows in (3, 5):
        fn(torch.randn(rows), 1)
    fn(torch.randn(3), 200)
    acc = compile_account.account(since, first_steps_ms=1e6)
    assert acc["recompiles"] >= 2 and acc["frames_compiled"] >= 3, acc
    reasons = " ".join(acc["recompile_reasons"])
    assert "size mismatch" in reasons and "n == 1" in reasons, reasons
    assert acc["graph_breaks"] >= 1 and any("print" in r for r in acc["graph_break_reasons"])
    assert acc["compile_s"] > 0 and acc["first_steps_running_ms"] < 1e6
    text = compile_account.describe(acc, settle=2)
    assert text.startswith("compile: ") and "recompiled (1x): " in text, text
    # A run that compiled nothing has no account, whatever compiled before it.
    assert compile_account.account(compile_account.begin(), 5.0) is None


@ONE_CPU_COMPILER
def test_a_compiled_run_accounts_for_its_compiles_and_writes_the_trace(tmp_path):
    """The model through Inductor on CPU: the footer's line and summary.json's section,
    and --torch-trace's folder holding what tlparse reads."""
    trace = tmp_path / "tlparse-in"
    summary = train.run(train.parse_config(TINY + [
        "--out-dir", str(tmp_path / "runs"), "--compile", "--torch-trace", str(trace)]))
    acc = summary["compile"]
    assert acc["graphs"] >= 1 and acc["frames_compiled"] >= 1, acc
    assert 0 < acc["compile_s"] * 1e3 <= acc["first_steps_ms"], acc
    assert "compile: " in summary["table"]
    logs = list(trace.iterdir())
    assert logs and any("dynamo_start" in p.read_text() for p in logs), logs
    saved = json.loads(next((tmp_path / "runs").glob("*/summary.json")).read_text())
    assert saved["compile"]["graphs"] == acc["graphs"]
