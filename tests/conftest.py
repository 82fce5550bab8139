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
