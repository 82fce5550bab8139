"""Every test draws fresh inputs, and a failing one names the seed that draws them again
(tests/conftest.py's a_fresh_seed_named_on_failure)."""

import os
import re
import subprocess
import sys

import torch

from tests.helpers import REPO

DRAW = """
import torch

def test_draw():
    print("drew", torch.randint(0, 2**31, ()).item())
    assert False
"""


def test_each_test_starts_from_a_seed_of_its_own(request):
    # Unseeded, torch starts every process from one constant seed (67280421310721), so a
    # worker's first draws were the same in every run.
    assert torch.initial_seed() == request.node.torch_seed
    if "TEST_TORCH_SEED" not in os.environ:
        assert torch.initial_seed() != torch.Generator().initial_seed()


def test_a_failure_names_the_seed_and_that_seed_draws_its_inputs_again(tmp_path):
    test_file = tmp_path / "test_draw.py"
    test_file.write_text(DRAW)
    seed = torch.randint(0, 2**31, ()).item()
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "tests.conftest", "-q",
                           "-p", "no:cacheprovider", str(test_file)], cwd=REPO,
                          env={**os.environ, "TEST_TORCH_SEED": str(seed)},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    again = torch.randint(0, 2**31, (), generator=torch.Generator().manual_seed(seed)).item()
    assert re.search(rf"^drew {again}$", done.stdout, re.M), done.stdout
    assert re.search(rf"^TEST_TORCH_SEED={seed} pytest '\S+::test_draw' draws this test's "
                     "inputs again$", done.stdout, re.M), done.stdout
