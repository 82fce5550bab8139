import os

import pytest
import torch

# Without a GPU, Triton's interpreter runs the kernels on CPU tensors. It must be chosen
# before triton is imported, so it is set here, before any test module loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make test-gpu on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def no_plain_trace_is_left(request):
    """Every test: no run folder it made may be left with a plain (not gzipped) trace."""
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp is not None:
        plain = sorted(str(p) for p in tmp.rglob("*.pt.trace.json"))
        assert not plain, f"plain traces left behind: {plain}"
