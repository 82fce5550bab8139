"""The speed-ups that swap a conv block's forward name the block (BoxNet.block), and a
speed-up that changes another's forward (the first block's kept code, the third block's
Triton backward) swaps that forward again with its own setting, rather than setting an
attribute on the module for the other to read."""

import pytest
import torch

from tests.helpers import model_with


def _calls(monkeypatch, module: str, kernel: str) -> list:
    """The positional arguments of every call of kernels.<module>.<kernel> from here on."""
    import importlib
    kernels = importlib.import_module(module)
    real, calls = getattr(kernels, kernel), []

    def recorded(*args):
        calls.append(args)
        return real(*args)
    monkeypatch.setattr(kernels, kernel, recorded)
    return calls


@pytest.mark.parametrize("names,kept", [({"triton_first_block"}, False),
                                        ({"triton_first_block", "triton_first_block_code"},
                                         True)])
def test_the_first_blocks_code_is_kept_where_its_speedup_is_on(monkeypatch, names, kept):
    calls = _calls(monkeypatch, "kernels.trunk.first_block", "first_block")
    model, _ = model_with(names, 32, 4, 8, seed=0)
    model(torch.randint(0, 256, (2, 1, 32, 32), dtype=torch.uint8))
    ((*_, keep_code),) = calls
    assert keep_code is kept


@pytest.mark.parametrize("names,triton", [({"triton_conv_pool"}, False),
                                          ({"triton_conv_pool", "triton_conv_pool_bwd"}, True)])
def test_the_third_blocks_backward_is_tritons_where_its_speedup_is_on(monkeypatch, names,
                                                                     triton):
    calls = _calls(monkeypatch, "kernels.trunk.conv_pool", "conv_pool_bias_relu")
    model, _ = model_with(names, 32, 4, 8, seed=0)
    model(torch.randint(0, 256, (2, 1, 32, 32), dtype=torch.uint8))
    ((*_, triton_backward),) = calls
    assert triton_backward is triton
