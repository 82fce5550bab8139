"""studies/cost_model.py: the bytes each design moves, the ring's times, and the choice
it makes from a rank's measured work (results/sharded_rank-h100.json, which has no
'-inline' steps; the command's default is the H200's, which has)."""

import json
import math
import subprocess
import sys

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
    rows = {(d, n): cm.predict(d, n, MEASURED, s, 8, cm.NVLINK_GBS, cm.NETWORK_GBS)
            for d in cm.DESIGNS for n in (2, 8, 64)}
    steps = {r["design"]: r["step ms median"] for r in MEASURED["steps"]}
    one, two = MEASURED["pieces"][0], MEASURED["pieces"][1]
    sgd = one["shadow SGD ms (H/N rows)"]
    # No '-inline' steps in this JSON: the whole SGD over the rows given away is saved,
    # and a tp rank's GEMMs at its shapes replace one GPU's.
    gemms = (two["lin1 GEMMs ms"] - one["lin1 GEMMs ms"] + two["lin2 GEMMs ms"]
             - one["lin2 GEMMs ms"])
    assert rows["tp", 2]["compute ms"] == pytest.approx(
        steps["tp"] - sgd + two["shadow SGD ms (H/N rows)"] + gemms, rel=1e-6)
    assert rows["ddp", 2]["compute ms"] == steps["ddp"]
    for n in (2, 8):
        assert max(cm.DESIGNS, key=lambda d: rows[d, n]["scaling"]) in ("tp", "tp2d")
    assert max(cm.DESIGNS, key=lambda d: rows[d, 64]["scaling"]) == "tp2d"


def test_the_update_beside_the_trunk_is_saved_only_where_the_trunk_did_not_hide_it():
    """With 'tp-inline' measured: the step without the update, plus what of the rank's
    smaller update the trunk cannot hide (it hid inline - beside of the whole)."""
    base = {"steps": [{"design": "tp", "step ms median": 18.0},
                      {"design": "tp-inline", "step ms median": 19.0}],
            "pieces": [{"world": 1, "lin1 GEMMs ms": 9.0, "lin2 GEMMs ms": 0.2,
                        "shadow SGD ms (H/N rows)": 4.0, "lin1 fwd": 3.0, "lin1 dW": 3.0}]}
    # 2 ranks: 2 ms of update, 1 ms hidden beside the trunk -> 1 ms left on the path.
    assert cm.compute_ms("tp", 2, base) == pytest.approx(19.0 - 4.0 + 1.0)
    # 8 ranks: 0.5 ms of update, all of it hidden.
    assert cm.compute_ms("tp", 8, base) == pytest.approx(19.0 - 4.0)
    # tp's features' all-gather hides behind the rank's own rows' GEMM (1/N of lin1's
    # forward), dx's reduce-scatter behind lin1's dW GEMM.
    assert cm.windows(base, 4)["own-rows"] == pytest.approx(0.75)
    assert cm.windows(base, 4)["dW"] == pytest.approx(3.0)


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
                                     "measured step ms (predicted off by; scaling; where) |"]
    tp2 = next(line for line in out.splitlines() if line.startswith("| tp | 2 |"))
    step, factor, where = next((m[2], m[3], m[4]) for m in cm.MEASURED if m[:2] == ("tp", 2))
    assert tp2.endswith(f"; {factor:.2f}x; {where}) |") and f"| {step:.2f} (" in tp2, tp2
    assert (tmp_path / "m.png").stat().st_size > 1000


@pytest.mark.parametrize("content", [b"", b"[1, 2]", b'{"steps": [], "pieces": []}',
                                     b'{"steps": [{"design": 1}]', b"\x80\xff\x00"])
def test_a_bad_measured_file_is_one_line_naming_it(tmp_path, capsys, content):
    bad = tmp_path / "bad.json"
    bad.write_bytes(content)
    assert cm.main(["--measured", str(bad)]) == 2
    out, err = capsys.readouterr()
    assert out == "" and len(err.strip().splitlines()) == 1, err
    assert err.startswith(f"error: --measured {bad}: "), err


def test_measure_needs_a_gpu(capsys, monkeypatch):
    import torch
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert cm.main(["--measure"]) == 2
    assert "--measure needs a CUDA GPU" in capsys.readouterr().err


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


def test_out_writes_the_table_its_chart_and_a_page(tmp_path, capsys):
    out = tmp_path / "cm"
    assert cm.main(["--worlds", "2,4", "--out", str(out)]) == 0
    printed = capsys.readouterr().out.strip().splitlines()
    assert printed[-1] == f"page: {out / 'index.html'} (open it in a browser)"
    assert (out / "costmodel.md").read_text().startswith("Predicted, not measured: ")
    page = (out / "index.html").read_text()
    assert "<th>predicted step ms</th>" in page and "src='costmodel.png'" in page
    assert (out / "costmodel.png").stat().st_size > 1000
    # Never over another cost model, and an unwritable folder: one line, nothing printed.
    for folder, why in ((out, "already holds a cost model"), (tmp_path / "f" / "x", "")):
        if not why:
            (tmp_path / "f").write_text("a file, not a folder")
        assert cm.main(["--worlds", "2", "--out", str(folder)]) == 2
        got, err = capsys.readouterr()
        assert got == "" and len(err.strip().splitlines()) == 1 and why in err, err


def test_a_rank_measured_on_a_fake_world_is_its_compute():
    """bench/sharded_rank.py's table D: rank 0 of a fake world of N (its kernels at their
    shapes, its collectives moving nothing) replaces the sum of pieces at that N; tp's
    with the graphed head (the default) over the plain one; a failed one (nan), or an N
    not measured, falls back to the pieces."""
    base = {"steps": [{"design": "one", "step ms median": 17.5},
                      {"design": "tp", "step ms median": 18.0},
                      {"design": "ddp", "step ms median": 18.5},
                      {"design": "tp", "world": 2, "step ms median": 16.9},
                      {"design": "tp-graphed", "world": 2, "step ms median": 16.6},
                      {"design": "ddp", "world": 2, "step ms median": 18.7},
                      {"design": "tp-graphed", "world": 4, "step ms median": float("nan")}],
            "pieces": [{"world": 1, "lin1 GEMMs ms": 9.0, "lin2 GEMMs ms": 0.2,
                        "shadow SGD ms (H/N rows)": 4.0, "lin1 fwd": 3.0, "lin1 dW": 3.0}]}
    assert cm.compute_ms("tp", 2, base) == 16.6
    # tp2d: tp inside a host of 8 (predict passes the shards: min(N, a host's GPUs)).
    with_8 = {**base, "steps": base["steps"] + [
        {"design": "tp-graphed", "world": 8, "step ms median": 15.0}]}
    assert cm.compute_ms("tp2d", 8, with_8) == 15.0
    assert cm.predict("tp2d", 16, with_8, cm.Shape(), 8, cm.NVLINK_GBS,
                      cm.NETWORK_GBS)["compute ms"] == 15.0
    assert cm.compute_ms("ddp", 2, base) == 18.7
    assert cm.compute_ms("ddp", 4, base) == 18.5  # not measured at 4: a world of one's
    assert cm.compute_ms("tp", 4, base) == pytest.approx(18.0 - 4.0 + 1.0)  # nan: pieces
    # The step's rest is the collectives': exposed, and contention on the hidden.
    row = cm.predict("tp", 2, base, cm.Shape(), 8, cm.NVLINK_GBS, cm.NETWORK_GBS)
    assert row["step ms"] == pytest.approx(16.6 + row["exposed ms"] + cm.CONTENTION * (
        row["NCCL ms"] - row["exposed ms"]))


@pytest.mark.gpu
def test_a_rank_of_a_fake_world_is_timed_on_one_gpu(tmp_path):
    """On the device: bench/sharded_rank.py's table D alone, rank 0 of a fake world of 2,
    runs each design's step (DDP's hook, FSDP2's gathers and tp's collectives moving
    nothing) and times it."""
    from tests.helpers import REPO
    out = tmp_path / "rank.json"
    done = subprocess.run([sys.executable, "bench/sharded_rank.py", "--designs", "",
                           "--worlds", "", "--fake-worlds", "2", "--warmup", "1",
                           "--steps", "2", "--json", str(out)], cwd=REPO,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = {(r["design"], r["world"]): r["step ms median"]
            for r in json.loads(out.read_text())["steps"]}
    assert set(rows) == {("tp-graphed", 2), ("ddp", 2), ("zero", 2)}, rows
    for design in ("tp-graphed", "ddp", "zero"):
        assert math.isfinite(rows[design, 2]) and rows[design, 2] > 0, done.stdout[-3000:]
