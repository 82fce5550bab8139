"""The range timeline (what the host does inside one range), on real H100 traces."""

from profiling.range_timeline import format_timeline, range_events
from profiling.range_timeline import main as timeline_main
from profiling.trace_events import load_trace
from tests.helpers import FIXTURES


def test_range_timeline_lists_the_fused_ops_launches_inside_the_loss_range():
    events = load_trace(FIXTURES / "gpu_kernel_train.pt.trace.json.gz")
    found = range_events(events, "loss")
    assert len(found) == 2  # the two profiled steps of the fixture
    for r, inside in found:
        names = [e["name"] for e in inside]
        assert "giou::triton_loss" in names
        assert sum("LaunchKernel" in n for n in names) == 2  # forward + finalize
        start, end = r["ts"], r["ts"] + r["dur"]
        assert all(start <= e["ts"] <= end for e in inside)
        text = format_timeline(r, inside)
        assert text.splitlines()[0].startswith("loss: ") and "giou::triton_loss" in text


def test_range_timeline_names_the_thread_of_work_done_off_the_ranges_thread():
    """The loss_backward range is opened on the main thread; its operators run on the
    autograd engine's thread, and the timeline says so (the loss range's own do not)."""
    events = load_trace(FIXTURES / "gpu_kernel_train.pt.trace.json.gz")
    for name, off_thread in (("loss", False), ("loss_backward", True)):
        for r, inside in range_events(events, name):
            body = format_timeline(r, inside).splitlines()[1:]
            assert body and all(("[thread " in line) == off_thread for line in body), name


def test_range_timeline_cli_says_when_the_range_is_missing(capsys):
    trace = str(FIXTURES / "gpu_kernel_train.pt.trace.json.gz")
    assert timeline_main([trace, "--range", "no_such_range"]) == 2
    assert "no range named 'no_such_range'" in capsys.readouterr().err
    assert timeline_main([trace, "--steps", "1"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line for line in lines if not line.startswith("  ")] == [lines[0]]  # one range
    assert lines[0].startswith("loss: ") and len(lines) > 3
