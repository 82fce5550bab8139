"""bench/trunk_beside.py's table of the rounds, and its spin kernel (on the GPU and in
Triton's interpreter), which must compute and store."""

import random

import pytest
import torch

from bench import trunk_beside


def _rounds(n: int) -> list[dict]:
    """n rounds of random times: kernels a (longest alone), b, c; c missing beside copy."""
    rounds = []
    for _ in range(n):
        ms = {k: random.uniform(lo, lo + 0.1) for k, lo in (("a", 2.0), ("b", 1.0), ("c", 0.1))}
        rounds.append({"alone": (ms, random.uniform(5, 6)),
                       "update": ({k: 2 * v for k, v in ms.items()}, random.uniform(9, 10)),
                       "copy": ({k: v for k, v in ms.items() if k != "c"}, 7.0)})
    return rounds


def test_the_table_has_the_longest_kernels_alone_and_each_cells_range():
    rounds = _rounds(3)
    lines = trunk_beside.table(rounds, top=2).splitlines()
    assert lines[0] == "| kernel (GPU ms a call) | alone | update | copy |"
    assert [line.split(" | ")[0] for line in lines[3:]] == ["| `a`", "| `b`"]
    spans = [r["update"][1] for r in rounds]
    assert f"| {min(spans):.3f}–{max(spans):.3f} |" in lines[2]
    assert lines[2].endswith("| 7.000 |")  # one value over the rounds: no range
    b_update = [r["update"][0]["b"] for r in rounds]
    assert lines[4].split(" | ")[2] == f"{min(b_update):.3f}–{max(b_update):.3f}"


def test_a_kernel_missing_beside_a_background_is_a_dash():
    lines = trunk_beside.table(_rounds(2), top=3).splitlines()
    assert lines[5].startswith("| `c` |") and lines[5].endswith("| – |")


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_the_spin_stores_what_it_computed(device):
    spin = trunk_beside.spin_kernel()
    out = torch.zeros(3 * 4, device=device)
    spin[(3,)](out, 2, BLOCK=4)
    x = torch.arange(4, dtype=torch.float32) * 1e-3 + torch.arange(3).view(3, 1)
    y = x + 1.0
    for _ in range(2):
        x = x * 0.999 + y
        y = y * 0.999 - x * 1e-4
    torch.testing.assert_close(out.view(3, 4).cpu(), x + y)
