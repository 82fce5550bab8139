"""The trace writer (gzip after the fact) and the range timeline, on real H100 traces."""

import gzip
from pathlib import Path

from profiling.range_timeline import format_timeline, main as timeline_main, range_events
from profiling.trace_summary import load_trace
from profiling.trace_writer import gzip_traces

FIXTURES = Path(__file__).parent / "fixtures"


def test_gzip_traces_replaces_the_plain_trace_with_the_same_bytes(tmp_path):
    body = b'{"traceEvents": [\n' + b'{"ph": "X"},\n' * 10000 + b'{}]}\n'
    (tmp_path / "train.1.pt.trace.json").write_bytes(body)
    (tmp_path / "other.json").write_bytes(b"{}")
    written = gzip_traces(tmp_path)
    assert written == [tmp_path / "train.1.pt.trace.json.gz"]
    assert gzip.decompress(written[0].read_bytes()) == body
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.json",
                                                          "train.1.pt.trace.json.gz"]
    assert gzip_traces(tmp_path) == []  # nothing plain left: nothing to do


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
