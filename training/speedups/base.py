"""What a speed-up is: one module of this package holding SPEEDUP = SpeedUp(...), its
name, help, where it applies (its refusals) and how (model, optimizer, process, step or
loss). Nothing here imports torch at import time: train.py --help reads every SPEEDUP.
Its design in full: docs/design.md."""

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Callable

CHOICES = ("auto", "on", "off")


@dataclass(frozen=True)
class SpeedUp:
    name: str
    help: str
    default: bool | str = True
    gpu_only: bool = False
    interpreter_slow: bool = False
    changes_maths: str | None = None
    several_ranks: bool = False
    refusal: Callable | None = None
    idle: Callable | None = None
    auto_off: Callable | None = None
    model: Callable | None = None
    optimizer: Callable | None = None
    process: Callable | None = None
    step: Callable | None = None
    loss: Callable | None = None

    @property
    def flag(self) -> str:
        return "--" + self.name.replace("_", "-")

    @property
    def choice(self) -> bool:
        """Whether it takes auto, on or off rather than being a switch."""
        return isinstance(self.default, str)

    def why_not(self, asked: "Asked", cuda: bool) -> str | None:
        """Why it cannot apply to this run (with the other speed-ups as asked), or None:
        its own refusal first (the most telling: a ragged strategy's step is no CUDA graph
        on any machine), then a GPU-only one without a GPU."""
        reason = self.refusal(asked, cuda) if self.refusal else None
        if reason is None and self.gpu_only and not cuda:
            reason = "needs a CUDA GPU"
        return reason


@dataclass(frozen=True)
class Asked:
    """What the speed-ups' checks read of a run: each speed-up's switch or choice as given
    (asked["cuda_graph"]), the strategy, the mode, autocast, the profiler's --wait, and the
    several-rank design the run uses ("ddp" on one rank) with its ranks. train.py fills
    it; nothing here reads train.Config's fields."""
    values: Mapping[str, bool | str]
    loss: str
    mode: str
    amp: bool
    wait: int
    design: str = "ddp"
    world: int = 1

    def __getitem__(self, name: str) -> bool | str:
        return self.values[name]


@dataclass(frozen=True)
class Build:
    """What a transform may need to know of the run: the dtype autocast gives the
    convolutions (bf16 on a GPU with --amp, else fp32), the learning rate."""
    autocast_dtype: object
    lr: float


def rebind(module, forward) -> None:
    """module's forward replaced by forward(module, x), for this instance alone (as
    Liger-Kernel patches a module): its class, children and parameters stay, so their
    names and values do, and torch.compile traces the new forward."""
    import types
    module.forward = types.MethodType(forward, module)
