"""core/names.py's registry: every strategy one torch-free record, every list derived from
the records, and the checks that read a trait read it there."""

import dataclasses
import subprocess
import sys

import pytest

from core import names
from core.errors import UserError
from tests.helpers import REPO


def test_the_lists_are_the_records_traits():
    assert names.STRATEGIES == tuple(names.REGISTRY)
    for name, record in names.REGISTRY.items():
        assert (name in names.RAGGED) == (record.layout == "list")
        assert (name in names.PACKED) == (record.layout == "packed")
        assert (name in names.FUSED) == record.fused
        assert (name in names.HOST_BOUND) == record.host_bound


def test_the_registry_reads_without_torch():
    code = ("import sys; sys.modules['torch'] = None; from core import names; "
            "print(len(names.REGISTRY))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0 and done.stdout.strip() == str(len(names.REGISTRY)), done


def test_an_unknown_strategy_or_layout_raises():
    with pytest.raises(UserError, match="unknown loss strategy 'fancy'"):
        names.traits("fancy")
    with pytest.raises(ValueError, match="layout 'jagged' is none of"):
        names.Traits("losses.padded:make", "jagged")
    from studies.sweep_point import layout_bytes
    with pytest.raises(UserError, match="unknown loss strategy 'fancy'"):
        layout_bytes("fancy", 4, 8, 3, 2, 1, 4)  # it was read as padded, silently


def test_a_strategy_that_syncs_is_refused_a_cuda_graph(monkeypatch):
    """The CUDA graph's check refused only ragged and packed layouts by name: a padded
    strategy that syncs with the host passed it."""
    from training.speedups import cuda_graph
    syncing = dataclasses.replace(names.REGISTRY["padded"], syncs=True)
    monkeypatch.setitem(names.REGISTRY, "syncing", syncing)
    from training.speedups.base import Asked
    asked = Asked(values={}, loss="syncing", mode="train", amp=True, wait=2)
    assert "waits for the device" in cuda_graph.refusal(asked, cuda=True)
    asked = dataclasses.replace(asked, loss="padded")
    assert "waits for the device" not in (cuda_graph.refusal(asked, cuda=False) or "")
