"""bench/trunk_ncu.py's table, read from ncu's raw CSV of one compiled trunk call on an H100
(tests/fixtures/gpu_trunk_ncu_raw.csv.gz: the tool's raw.csv, gzipped)."""

import gzip

from bench import trunk_ncu
from studies.ncu import read_raw
from tests.helpers import REPO

RAW = REPO / "tests" / "fixtures" / "gpu_trunk_ncu_raw.csv.gz"


def _rows() -> dict[str, list[str]]:
    text = gzip.decompress(RAW.read_bytes()).decode()
    lines = trunk_ncu.table(read_raw(text)).splitlines()
    assert lines[1].count("|") == lines[0].count("|") == 10
    return {line.split(" | ")[0].removeprefix("| "): line.split(" | ")[1:] for line in lines[2:]}


def test_a_row_for_each_kernel_the_call_ran():
    rows = _rows()
    assert len(rows) == 13
    assert {"`_second_block_xgrad`", "`_conv_pool_fwd`", "cuDNN fprop", "cuDNN dgrad",
            "cuDNN wgrad"} <= set(rows)


def test_the_cells_are_the_launchs_metrics():
    text = gzip.decompress(RAW.read_bytes()).decode()
    launch = next(x for x in read_raw(text) if "_second_block_xgrad" in x["Kernel Name"])
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
    text = gzip.decompress(RAW.read_bytes()).decode()
    for launch in read_raw(text):
        stalls = {k.removeprefix(trunk_ncu.STALL[0]).removesuffix(trunk_ncu.STALL[1]):
                  float(v) for k, v in launch.items()
                  if k.startswith(trunk_ncu.STALL[0]) and k.endswith(trunk_ncu.STALL[1])}
        stalls.pop("selected")
        cell = trunk_ncu.row(launch).split(" | ")[-1].removesuffix(" |")
        named = [part.split()[0] for part in cell.split(", ")]
        assert named == sorted(stalls, key=stalls.get, reverse=True)[:3], cell
