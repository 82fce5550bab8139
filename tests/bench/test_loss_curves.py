"""bench/loss_curves.py, as a user runs it: two runs' losses side by side in a CSV, the
gaps printed, the chart written; bad input in one line and exit 2. And its chart: runs
whose differences coincide stay visible."""

import json
import subprocess
import sys

from studies import charts
from tests.test_cpu_output import _drawn

ENV = {"device": "NVIDIA H100 80GB HBM3", "commit": "32e65a9abcdef"}


def _run(tmp_path, name: str, losses: list[float]) -> str:
    folder = tmp_path / name
    folder.mkdir()
    (folder / "summary.json").write_text(json.dumps({"losses": losses, "environment": ENV}))
    return str(folder)


def _loss_curves(*args):
    return subprocess.run([sys.executable, "bench/loss_curves.py", *args],
                          capture_output=True, text=True, timeout=120)


def test_the_csv_the_gaps_and_the_chart(tmp_path):
    base = _run(tmp_path, "bf16", [1.0, 2.0, 4.0])
    other = _run(tmp_path, "float8", [1.01, 2.0])
    done = _loss_curves("--out", str(tmp_path / "lc"), f"bf16={base}", f"float8={other}")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "lc.csv").read_text() == ("step,bf16,float8\n1,1,1.01\n2,2,2\n"
                                                 "3,4,\n")
    assert done.stdout.splitlines()[0] == ("float8 against bf16: 2 steps, the largest gap "
                                           "1.000% of the loss, the mean 0.500%")
    assert (tmp_path / "lc.png").stat().st_size > 0


def test_bad_input_gets_one_line_and_exit_2(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "summary.json").write_text(json.dumps({"steps": 3}))
    for arg, said in ((str(empty), "give each run as label=run-folder"),
                      (f"a={empty}", "holds no losses"),
                      (f"a={tmp_path / 'none'}", "cannot read")):
        done = _loss_curves("--out", str(tmp_path / "lc"), arg)
        assert done.returncode == 2 and said in done.stderr, done.stderr
        assert len(done.stderr.splitlines()) == 1 and not done.stdout


def test_runs_whose_differences_coincide_are_drawn_in_styles_of_their_own(tmp_path,
                                                                         monkeypatch):
    """float8 on two strategies differs from bf16 by the same amounts: the second mean
    line hid the first until each took a style of its own."""
    runs = [("bf16", [1.0] * 40), ("kernel float8", [1.001] * 40),
            ("padded float8", [1.001] * 40)]
    fig = _drawn(monkeypatch, lambda: charts.loss_curves_chart(runs, tmp_path / "l.png",
                                                               "here"))
    bottom = fig.axes[1]
    means = [line for line in bottom.get_lines() if not line.get_label().startswith("_")]
    assert [m.get_label().split(" − ")[0] for m in means] == ["kernel float8",
                                                              "padded float8"]
    assert means[0].get_linestyle() != means[1].get_linestyle()
    assert "differences below" in fig.axes[0].get_title()
    assert fig._suptitle.get_text().endswith("here")
