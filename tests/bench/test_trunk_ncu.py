"""bench/trunk_ncu.py's table, read from ncu's raw CSV of one compiled trunk call on an H100
(tests/fixtures/gpu_trunk_ncu_raw.csv.gz; `bench/record_fixtures.sh DEST ncu` records it
anew; the one in the tree is from the probe that became the tool, the same sections and
kernels), and its run under a fake ncu."""

import gzip

import pytest

from bench import trunk_ncu
from studies.ncu import read_raw
from tests.helpers import REPO

RAW = REPO / "tests" / "fixtures" / "gpu_trunk_ncu_raw.csv.gz"


def _launches() -> list[dict]:
    return read_raw(gzip.decompress(RAW.read_bytes()).decode())


def _rows() -> dict[str, list[str]]:
    lines = trunk_ncu.table(_launches()).splitlines()
    assert lines[1].count("|") == lines[0].count("|") == 10
    return {line.split(" | ")[0].removeprefix("| "): line.split(" | ")[1:] for line in lines[2:]}


def test_a_row_for_each_kernel_the_call_ran():
    rows = _rows()
    assert len(rows) == 13
    assert {"`_second_block_xgrad`", "`_conv_pool_fwd`", "cuDNN fprop", "cuDNN dgrad",
            "cuDNN wgrad"} <= set(rows)


def test_the_cells_are_the_launchs_metrics():
    launch = next(x for x in _launches() if "_second_block_xgrad" in x["Kernel Name"])
    cells = _rows()["`_second_block_xgrad`"]
    us = float(launch["gpu__time_duration.sum"].replace(",", ""))
    assert launch["_units"]["gpu__time_duration.sum"] in ("ns", "nsecond", "us", "usecond")
    if launch["_units"]["gpu__time_duration.sum"].startswith("n"):
        us /= 1e3
    assert cells[0] == f"{us:.0f}"
    assert cells[5] == f"{float(launch['launch__registers_per_thread']):.0f}"
    pipe, share = cells[4].split()
    shares = {p: float(launch[f"sm__inst_executed_pipe_{p}{trunk_ncu.SHARE}"])
              for p in trunk_ncu.PIPES}
    assert pipe == max(shares, key=shares.get) and share == f"{shares[pipe]:.0f}"


def test_the_stalls_are_the_three_largest_but_selected():
    for launch in _launches():
        stalls = {k.removeprefix(trunk_ncu.STALL[0]).removesuffix(trunk_ncu.STALL[1]):
                  float(v) for k, v in launch.items()
                  if k.startswith(trunk_ncu.STALL[0]) and k.endswith(trunk_ncu.STALL[1])}
        stalls.pop("selected")
        cell = trunk_ncu.row(launch).split(" | ")[-1].removesuffix(" |")
        named = [part.split()[0] for part in cell.split(", ")]
        assert named == sorted(stalls, key=stalls.get, reverse=True)[:3], cell


def _fake_ncu(tmp_path, monkeypatch, body: str):
    """An `ncu` on PATH that runs body (sh); torch told there is a GPU."""
    fake = tmp_path / "bin" / "ncu"
    fake.parent.mkdir()
    fake.write_text(f"#!/bin/sh\n{body}\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:/usr/bin:/bin")
    monkeypatch.setattr("torch.cuda.is_available", lambda: True)
    monkeypatch.setattr("torch.cuda.get_device_name", lambda *a: "a fake GPU")


def test_the_tool_runs_itself_under_ncu_and_prints_the_table(tmp_path, monkeypatch, capsys):
    """ncu is given the kernels, the sections, a raw CSV log and this tool's one-call child
    with its options; the log it writes is the table printed."""
    raw = tmp_path / "raw.csv.gz"
    raw.write_bytes(RAW.read_bytes())
    # The fake writes the recorded CSV where --log-file says, and its arguments beside it.
    _fake_ncu(tmp_path, monkeypatch, f'echo "$@" > {tmp_path}/args\nwhile [ $# -gt 0 ]; do '
              f'if [ "$1" = --log-file ]; then gunzip -c {raw} > "$2"; fi; shift; done')
    out = tmp_path / "out"
    monkeypatch.setattr("sys.argv", ["bench/trunk_ncu.py", "--out", str(out), "--", "--backend",
                                     "cuda"])
    trunk_ncu.main()
    args = (tmp_path / "args").read_text().split()
    assert args[args.index("--kernel-name") + 1] == trunk_ncu.KERNELS
    assert [args[i + 1] for i, a in enumerate(args) if a == "--section"] == list(trunk_ncu.SECTIONS)
    assert args[args.index("--profile-from-start") + 1] == "off"
    assert args[-7:] == [trunk_ncu.__file__, "--one-call", "--loss", "kernel", "--", "--backend",
                         "cuda"]
    printed = capsys.readouterr().out
    assert "| `_second_block_xgrad` |" in printed and "a fake GPU" in printed
    assert (out / "raw.csv").exists()


def test_counters_kept_from_the_user_are_one_line(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, monkeypatch, "echo '==ERROR== ERR_NVGPUCTRPERM - no permission'\nexit 1")
    monkeypatch.setattr("sys.argv", ["bench/trunk_ncu.py", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as ended:
        trunk_ncu.main()
    assert ended.value.code.startswith("error: ncu may not read this GPU's performance counters")


def test_a_run_that_profiled_nothing_is_one_line(tmp_path, monkeypatch):
    _fake_ncu(tmp_path, monkeypatch, "echo 'the child failed'\nexit 3")
    monkeypatch.setattr("sys.argv", ["bench/trunk_ncu.py", "--out", str(tmp_path / "out")])
    with pytest.raises(SystemExit) as ended:
        trunk_ncu.main()
    assert ended.value.code == "error: ncu profiled nothing (exit 3): the child failed"
