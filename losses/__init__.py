"""The loss strategies for ragged targets, by name (core/names.py lists them).

    strategy = losses.get("padded")     # or loop, concat, compiled, kernel, conditional,
                                        # packed, nested, compiled_packed
    images, targets = strategy.collate(samples)
    loss = strategy.loss(pred, strategy.to_device(targets, device))

Adding a strategy: write losses/<name>.py with a `make(capacity, backend) -> Strategy`,
add its name to core.names.STRATEGIES and one line to _MAKERS.
"""

from core.names import BACKENDS, STRATEGIES
from losses import compiled, compiled_packed, concat, fused, loop, nested, packed, padded
from losses.strategy import Strategy

_MAKERS = {
    "loop": loop.make,
    "concat": concat.make,
    "padded": padded.make,
    "compiled": compiled.make,
    "kernel": fused.make_kernel,
    "conditional": fused.make_conditional,
    "packed": packed.make,
    "nested": nested.make,
    "compiled_packed": compiled_packed.make,
}
assert tuple(_MAKERS) == STRATEGIES, "core.names.STRATEGIES and _MAKERS must agree"


def get(name: str, backend: str = "triton", capacity: int = 256) -> Strategy:
    """The strategy `name`; `backend` picks the fused strategies' kernels and must be one
    of core.names.BACKENDS for every strategy (a typo is an error, never ignored)."""
    if name not in _MAKERS:
        raise ValueError(f"unknown loss strategy {name!r}: choose one of "
                         f"{', '.join(STRATEGIES)}")
    if backend not in BACKENDS:
        raise ValueError(f"unknown kernel backend {backend!r}: choose one of "
                         f"{', '.join(BACKENDS)}")
    return _MAKERS[name](capacity=capacity, backend=backend)


__all__ = ["get", "Strategy"]
