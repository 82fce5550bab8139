"""What a speed-up is: one module of this package holding SPEEDUP = SpeedUp(...), which
says its name, its help, where it applies, and how it applies:

    model(model, build)        transforms the built BoxNet in place, before DDP and
                               torch.compile: a block's forward rebound to a fused kernel
                               (rebind), lin1's weight made bf16; parameter names kept,
                               and values (so the same seed gives the same weights)
    optimizer(model, make, build)
                               -> make: wraps the optimizer's maker, make(params) ->
                               optimizer (fused SGD, the bf16 shadow's own step)
    process(on, cuda, many)    sets a process-wide flag for every run, on or off (cuDNN's
                               autotuning)
    step(train_step, to_device, asked)
                               -> what replays the step (the CUDA graph)
    loss(loss_fn)              -> the strategy's loss wrapped (its graph), as Liger
                               swaps a model's loss for its own

and where it is refused: gpu_only; refusal(asked, cuda) (why it cannot apply to a run, or
None: a switch given there, or a choice given "on", is one line and exit 2, "auto" is off
with that reason); idle(asked, on) (why it would do nothing in a run where it is on: the
forward mode's optimizer, a backward whose forward is off; recorded off, no error; `on`
holds the speed-ups before it in the ladder, resolved); auto_off(asked) (why "auto" leaves
a choice off in a run where it could apply, measured not to pay there; "on" still turns
it on); interpreter_slow (Triton kernels that the interpreter runs at ~100 s a step on 2
cores: off in the CPU preset, make ladder skips it on a CPU); changes_maths (what it
changes in the step's maths, or None for the baseline's maths: such a one is off by
default, the tests that hold every speed-up to the baseline's losses leave it out, and
the run's start line, make ladder's rung and make compare's row say so); several_ranks (it
applies to a job of several ranks only, as part of its design: a one-GPU run cannot ask for
it, so a one-GPU baseline is compared without it). A switch (default True or
False) is a flag --name / --no-name; a choice (default "auto", "on" or "off") takes one
of those, auto meaning "where the run allows it" (and, with auto_off, where it pays).
What they read of the run is an Asked record, which train.py fills (asked_of).

Nothing here imports torch at import time (train.py --help reads every SPEEDUP).
"""

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
    several-rank design the run uses ("ddp" on one rank). train.py fills it; nothing here
    reads train.Config's fields."""
    values: Mapping[str, bool | str]
    loss: str
    mode: str
    amp: bool
    wait: int
    design: str = "ddp"

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
