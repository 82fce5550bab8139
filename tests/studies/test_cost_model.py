"""studies/cost_model.py: the bytes each design moves, the ring's times, and the choice
it makes from a rank's measured work (results/sharded_rank-h100.json)."""

import json

import pytest

from studies import cost_model as cm

MEASURED = json.loads(open("results/sharded_rank-h100.json").read())


def test_a_ring_moves_what_nccl_documents():
    # 2 (N-1)/N of the bytes for an all-reduce, (N-1)/N for a gather or a scatter.
    assert cm.ring("all-reduce", 100e9, 2, 100.0) == pytest.approx(1000.0)
    assert cm.ring("all-gather", 100e9, 4, 100.0) == pytest.approx(750.0)
    assert cm.ring("reduce-scatter", 1e9, 1, 100.0) == 0.0


def test_bytes_per_rank_at_the_full_size():
    s = cm.Shape()
    # ddp: lin1's bf16 gradient (2.15 GB) and the fp32 rest, all-reduced.
    assert cm.sent_per_rank("ddp", 2, s) / 1e9 == pytest.approx(2.22, abs=0.01)
    # tp: each rank's 134 MB of bf16 features out, and their gradient back.
    assert cm.sent_per_rank("tp", 2, s) / 1e9 == pytest.approx(0.27, abs=0.01)
    # zero sends what ddp does (a reduce-scatter and an all-gather of the bf16 weight).
    assert cm.sent_per_rank("zero", 8, s) == pytest.approx(cm.sent_per_rank("ddp", 8, s),
                                                           rel=0.01)
    # tp2d's gathers stay in a host of 8: past one host it sends less than tp.
    assert cm.sent_per_rank("tp2d", 64, s) < cm.sent_per_rank("tp", 64, s) / 5


def test_the_model_halves_the_optimizer_and_picks_tp_inside_a_host():
    s = cm.Shape()
    window = {"forward": 2.0, "backward": 7.0, "hidden": 7.0, "hidden-across": 7.0}
    rows = {(d, n): cm.predict(d, n, MEASURED, s, 8, cm.NVLINK_GBS, cm.NETWORK_GBS, window)
            for d in cm.DESIGNS for n in (2, 8, 64)}
    steps = {r["design"]: r["step ms median"] for r in MEASURED["steps"]}
    sgd = MEASURED["pieces"][0]["shadow SGD ms (H/N rows)"]
    assert rows["tp", 2]["compute ms"] == pytest.approx(steps["tp"] - sgd / 2, rel=0.01)
    assert rows["ddp", 2]["compute ms"] == steps["ddp"]
    for n in (2, 8):
        assert max(cm.DESIGNS, key=lambda d: rows[d, n]["scaling"]) in ("tp", "tp2d")
    assert max(cm.DESIGNS, key=lambda d: rows[d, 64]["scaling"]) == "tp2d"


def test_bad_worlds_are_one_line(capsys):
    assert cm.main(["--worlds", "1,2"]) == 2
    assert "--worlds are numbers of GPUs, 2 or more" in capsys.readouterr().err
    assert cm.main(["--measured", "nowhere.json"]) == 2
    assert "--measured nowhere.json" in capsys.readouterr().err
    assert cm.main(["--worlds", "2,x"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["error: --worlds 2,x: 'x' is not a whole number of GPUs (e.g. --worlds "
                   "2,4,8)"], err


def test_the_command_prints_the_table_and_the_choice(tmp_path, capsys):
    assert cm.main(["--worlds", "2,8", "--chart", str(tmp_path / "m.png")]) == 0
    out = capsys.readouterr().out
    assert "| tp | 2 |" in out and "Best design at each N: 2: tp" in out
    # Every figure the model made says "predicted"; a measured one stands beside it.
    assert out.startswith("Predicted, not measured: from one GPU's step of ")
    head = next(line for line in out.splitlines() if line.startswith("| design"))
    assert head.split(" | ")[2:] == ["predicted compute ms", "predicted NCCL ms",
                                     "predicted exposed ms", "predicted step ms",
                                     "GB sent a rank", "predicted scaling",
                                     "measured scaling |"]
    tp2 = next(line for line in out.splitlines() if line.startswith("| tp | 2 |"))
    assert tp2.endswith("| 2.02 (2 H100s, a8b9e5b) |"), tp2
    assert (tmp_path / "m.png").stat().st_size > 1000


@pytest.mark.parametrize("args,message", [
    (["--gpus-per-host", "0"], "--gpus-per-host must be 1 or more, not 0"),
    (["--nvlink-gbs", "0"], "--nvlink-gbs must be a positive number of GB/s, not 0.0"),
    (["--network-gbs", "-5"], "--network-gbs must be a positive number of GB/s, not -5.0"),
    (["--network-gbs", "nan"], "--network-gbs must be a positive number of GB/s, not nan"),
    (["--worlds", "2", "--chart", "/proc/x.png"], "--chart /proc/x.png: "),
])
def test_bad_machine_numbers_and_charts_are_one_line(capsys, args, message):
    """They raised ZeroDivisionError, printed negative times, made ddp best everywhere
    (nan) or gave a traceback (a chart that cannot be written)."""
    assert cm.main(args) == 2
    out, err = capsys.readouterr()
    err = err.strip().splitlines()
    assert len(err) == 1 and message in err[0], err
    assert out == ""  # the table was printed before the chart's error


def test_a_design_that_refuses_the_world_is_not_predicted(capsys):
    """3 GPUs: lin1's 16384 rows do not split over 3, and --parallel tp refuses it; the
    model predicted tp best there."""
    assert cm.main(["--worlds", "3,8"]) == 0
    out = capsys.readouterr().out
    assert "| tp | 3 |" not in out and "| zero | 3 |" not in out and "| ddp | 3 |" in out
    assert ("not predicted: tp on 3 GPUs (lin1's 16384 rows do not split evenly over 3 "
            "ranks; --parallel tp refuses it)") in out
    assert "Best design at each N: 3: ddp" in out
    assert cm.cannot_apply("tp2d", 12, 16384, 8) == "12 GPUs are not whole hosts of 8"
    assert cm.cannot_apply("tp2d", 16, 16384, 8) is None
