"""The loss strategies for ragged targets, by name (core/names.py lists them).

    strategy = losses.get("padded")     # or loop, concat, compiled, kernel, conditional,
                                        # packed, nested, compiled_packed
    images, targets = strategy.collate(samples)
    loss = strategy.loss(pred, strategy.to_device(targets, device))

Adding a strategy: write losses/<name>.py with a `make(capacity, backend) -> Strategy`,
and add its record, one line, to core.names.REGISTRY (its maker, layout and traits).
"""

import importlib

from core.names import BACKENDS, REGISTRY, STRATEGIES
from losses.strategy import Strategy


def _maker(path: str):
    module, function = path.split(":")
    return getattr(importlib.import_module(module), function)


# Every maker, imported now as the modules were before the registry held their paths (their
# kernels' custom ops are registered on import).
_MAKERS = {name: _maker(record.maker) for name, record in REGISTRY.items()}


def get(name: str, backend: str = "triton", capacity: int = 256) -> Strategy:
    """The strategy `name`; `backend` picks the fused strategies' kernels and must be one
    of core.names.BACKENDS for every strategy (a typo is an error, never ignored)."""
    if name not in STRATEGIES:
        raise ValueError(f"unknown loss strategy {name!r}: choose one of "
                         f"{', '.join(STRATEGIES)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}: choose one of "
                         f"{', '.join(BACKENDS)}")
    return _MAKERS[name](capacity=capacity, backend=backend)


__all__ = ["get", "Strategy"]
