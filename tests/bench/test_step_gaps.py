"""bench/step_gaps.py on traces recorded on the GPU (tests/fixtures): each step's busy time
and its idle gaps fill the span from its first GPU activity to its last; a missing run is
one line."""

import re

import pytest

from bench import step_gaps
from tests.helpers import REPO

STEP = re.compile(r"(ProfilerStep#\d+): wall (\S+) ms; GPU from \+(\S+) to \+(\S+) ms, "
                  r"busy (\S+) ms, (\d+) activities")


@pytest.mark.parametrize("fixture", ("gpu_graph_train", "gpu_kernel_train", "gpu_ddp_rank0"))
def test_busy_and_gaps_fill_each_steps_gpu_span(fixture, capsys):
    trace = REPO / "tests" / "fixtures" / f"{fixture}.pt.trace.json.gz"
    assert step_gaps.main([str(trace), "--gaps", "100000"]) == 0
    steps = []
    for line in capsys.readouterr().out.splitlines():
        if found := STEP.match(line):
            wall, first, last, busy = map(float, found.group(2, 3, 4, 5))
            steps.append([wall, last - first, busy, 0.0, 0])
        else:
            steps[-1][3] += float(re.match(r"\s+idle\s+(\S+) ms after ", line).group(1))
            steps[-1][4] += 1
    assert len(steps) >= 2
    for wall, span, busy, idle, gaps in steps:
        assert 0 < busy <= span <= wall
        # Printed to 2 places (busy, span) and 3 (each gap): that much rounding at most.
        assert busy + idle == pytest.approx(span, abs=0.01 + 0.0005 * gaps)


def test_a_folder_without_a_trace_is_one_line(tmp_path, capsys):
    assert step_gaps.main([str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: no profiler trace") and err.count("\n") == 1
