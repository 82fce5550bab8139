"""The loss strategies for ragged targets, by name.

    strategy = losses.get("padded")     # or loop, concat, compiled, kernel, conditional
    images, targets = strategy.collate(samples)
    loss = strategy.loss(pred, strategy.to_device(targets, device))

Adding a strategy: write losses/<name>.py with a `make(capacity, kernel) -> Strategy`
and add one line to _MAKERS.
"""

from errors import UserError
from losses import compiled, concat, fused, loop, padded
from losses.strategy import Strategy

_MAKERS = {
    "loop": loop.make,
    "concat": concat.make,
    "padded": padded.make,
    "compiled": compiled.make,
    "kernel": fused.make_kernel,
    "conditional": fused.make_conditional,
}

NAMES = tuple(_MAKERS)


def describe(name: str, kernel: str) -> str:
    """How tables and folders name a strategy: 'padded', or 'kernel/triton' for the fused
    strategies, whose backend matters."""
    return f"{name}/{kernel}" if name in fused.FUSED else name


def get(name: str, kernel: str = "triton", capacity: int = 256) -> Strategy:
    if name not in _MAKERS:
        raise UserError(f"unknown loss strategy {name!r}: choose one of {', '.join(NAMES)}")
    return _MAKERS[name](capacity=capacity, kernel=kernel)


__all__ = ["get", "describe", "NAMES", "Strategy"]
