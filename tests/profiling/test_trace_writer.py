"""The trace writer: the profiler's plain trace gzipped after the fact."""

import gzip

from profiling.trace_writer import gzip_traces


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
