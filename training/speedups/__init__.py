"""The training step's speed-ups: each one module of this package (base.py says what a
speed-up holds), applied in ORDER, the ladder's order, to the plain model, its optimizer or
the process; all off with --baseline. Adding one: a module with SPEEDUP = SpeedUp(...) and
its name in ORDER. Nothing here imports torch at import time (train.py --help reads every
SPEEDUP). The design in full: docs/design.md, this module's section."""

import functools
import importlib

from core.cli import option
from core.errors import UserError
from training.speedups.base import CHOICES, Asked, Build, SpeedUp

ORDER = ("cudnn_benchmark", "fused_sgd", "channels_last", "triton_first_block",
         "triton_second_block", "triton_pool", "triton_conv_pool", "triton_conv_pool_bwd",
         "bf16_shadow", "triton_first_block_code", "graphed_head",
         "lin1_update_beside_trunk", "split_master", "skip_unchanged_weight", "cuda_graph",
         "graphed_loss", "copy_engine_collectives", "sms_for_collectives", "float8_lin1")
SPEEDUPS: tuple[SpeedUp, ...] = tuple(
    importlib.import_module(f"{__name__}.{name}").SPEEDUP for name in ORDER)
BY_NAME = {s.name: s for s in SPEEDUPS}
assert tuple(BY_NAME) == ORDER, "each module's SPEEDUP must carry the module's name"


def switches(cls):
    """A config class with one field per speed-up added after its field `baseline`, in
    ORDER: a switch (--name / --no-name) or a choice (auto, on, off), with its help and
    default. Applied before @dataclass, which then makes them fields like the others."""
    annotations, added = {}, {}
    for s in SPEEDUPS:
        added[s.name] = str if s.choice else bool
        setattr(cls, s.name, option(s.default, s.help, choices=CHOICES if s.choice else None))
    for name, kind in cls.__annotations__.items():
        annotations[name] = kind
        if name == "baseline":
            annotations.update(added)
    cls.__annotations__ = annotations
    return cls


def baseline_values() -> dict:
    """Every speed-up off: the step as the original ran it."""
    return {s.name: "off" if s.choice else False for s in SPEEDUPS}


def cpu_preset_values() -> dict:
    """Off in the CPU preset: the GPU-only switches, and the Triton kernels that the
    interpreter runs at ~100 s a step."""
    return {s.name: False for s in SPEEDUPS
            if not s.choice and (s.gpu_only or s.interpreter_slow)}


def check(asked: Asked, cuda: bool) -> None:
    """A speed-up asked for (a switch on, a choice "on") where it cannot apply: one line,
    before anything is written."""
    for s in SPEEDUPS:
        value = asked[s.name]
        if s.choice and value not in CHOICES:
            raise UserError(f"{s.flag} takes auto, on or off, not {value!r}")
        if value in (True, "on"):
            reason = s.why_not(asked, cuda)
            if reason and s.choice:
                raise UserError(f"{s.flag} on: {reason}; use {s.flag} off or auto")
            if reason:
                raise UserError(f"{s.flag} {reason}; leave it out (or --no-{s.flag[2:]}) "
                                "here")


def resolve(asked: Asked, cuda: bool) -> dict:
    """What this run uses: each speed-up on or off, and for each choice why it is off
    (None where it is on). Recorded in summary.json."""
    on, reasons = {}, {}
    for s in SPEEDUPS:
        value = asked[s.name]
        if value in (False, "off"):
            reason = "turned off"
        else:  # a switch on passed check(); a choice on or auto may still not apply
            reason = s.why_not(asked, cuda) if s.choice else None
        if reason is None and value == "auto" and s.auto_off:
            reason = s.auto_off(asked)
        if reason is None and s.idle:
            reason = s.idle(asked, on)
        on[s.name] = reason is None
        if s.choice:
            reasons[f"{s.name}_off_because"] = reason
    return {"on": on, **reasons}


def maths_changed(on: dict) -> str:
    """What the speed-ups that are on ({name: on}, a summary's) change in the step's maths,
    or "same" (the baseline's maths): make ladder's and make compare's column."""
    changes = [BY_NAME[n].changes_maths for n, value in on.items()
               if value and n in BY_NAME and BY_NAME[n].changes_maths]
    return "; ".join(changes) or "same"


def describe_used(speed: dict, world: int = 1) -> str:
    """One line for the run's start: which speed-ups are on (those that change the maths
    say so), and why a choice asked for (auto) is off; on one rank, not why a several-rank
    one is (tp's graphed head: every one-GPU run would say it, to no purpose)."""
    on = [name + (f" (CHANGES THE MATHS: {BY_NAME[name].changes_maths})"
                  if BY_NAME[name].changes_maths else "")
          for name, value in speed["on"].items() if value]
    text = ", ".join(on) if on else "none (baseline)"
    for s in SPEEDUPS:
        reason = speed.get(f"{s.name}_off_because")
        if reason and reason != "turned off" and (world > 1 or not s.several_ranks):
            text += f"; no {s.name}: {reason}"
    return text


def runs_triton(asked: Asked) -> bool:
    """Whether a speed-up asked for runs Triton kernels in the model (where the
    interpreter runs them, the profiler's memory events break: profiling/harness.py)."""
    return any(asked[s.name] for s in SPEEDUPS if s.interpreter_slow)


def set_process_flags(used: dict, cuda: bool, many_runs: bool) -> None:
    """The process-wide flags of every speed-up that has one, on or off, for every run.
    many_runs: this process measures several runs side by side (make compare, ladder)."""
    for s in SPEEDUPS:
        if s.process:
            s.process(used[s.name], cuda, many_runs)


def build_context(amp: bool, lr: float, device) -> Build:
    import torch
    autocast = amp and device.type == "cuda"
    return Build(autocast_dtype=torch.bfloat16 if autocast else torch.float32, lr=lr)


def model_transform(used: dict, build: Build):
    """transform(model): the model speed-ups that are on, in ORDER, applied in place;
    transform.key says which, for model/build.py's reuse of a model between runs."""
    applied = [s for s in SPEEDUPS if used[s.name] and s.model]

    def transform(model) -> None:
        for s in applied:
            s.model(model, build)
    transform.key = (tuple(s.name for s in applied), build.autocast_dtype)
    return transform


def make_optimizer(model, used: dict, build: Build):
    """SGD with momentum (training/optimizer.py), its maker wrapped by each optimizer
    speed-up that is on, in ORDER."""
    from training.optimizer import momentum_sgd
    make = functools.partial(momentum_sgd, lr=build.lr)
    for s in SPEEDUPS:
        if used[s.name] and s.optimizer:
            make = s.optimizer(model, make, build)
    return make(list(model.parameters()))


def build(used: dict, device, reuse: bool, sizes: tuple, amp: bool, lr: float, wrap=None,
          wrap_key=None):
    """(model, runner, optimizer) of a run: the plain model of `sizes` (model/build.py's
    image_size, capacity, hidden, compile and seed) built and transformed by the speed-ups
    that are on, then wrapped (DDP on several ranks) and compiled, and its optimizer."""
    from model import build_model
    context = build_context(amp, lr, device)
    model, runner = build_model(*sizes, device, reuse, model_transform(used, context),
                                wrap=wrap, wrap_key=wrap_key)
    return model, runner, make_optimizer(model, used, context)


def graphed_step(used: dict, train_step, to_device, asked: Asked):
    """What replays the step (the CUDA graph), or None: the step runs as it is."""
    for s in SPEEDUPS:
        if used[s.name] and s.step:
            return s.step(train_step, to_device, asked)
    return None


def wrap_loss(used: dict, loss_fn):
    """The strategy's loss wrapped by each loss speed-up that is on, in ORDER."""
    for s in SPEEDUPS:
        if used[s.name] and s.loss:
            loss_fn = s.loss(loss_fn)
    return loss_fn
