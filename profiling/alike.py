"""When two runs' figures may be set side by side: the same workload, step, loader, seed,
ranks and device, read from their summary.json files; strategy, backend and mode are a
comparison's rows, not a difference. The design in full: docs/design.md, this module's
section."""

from core.names import describe as strategy_name
from training.speedups import BY_NAME
from training.speedups import ORDER as SPEEDUPS


def strategy(summary: dict) -> str:
    """The run's strategy as tables name it: padded, kernel/triton..."""
    config = summary["config"]
    # "kernel" is the backend's name in summaries written before it was called "backend".
    return strategy_name(config["loss"], config.get("backend", config.get("kernel")))


def _config(key: str, default=None):
    return lambda s: s["config"].get(key, default)


def _speedups_asked(summary: dict, one_rank: bool = False) -> str:
    """The speed-ups the run asked for; one_rank: those a one-GPU run can ask for too."""
    config = summary["config"]
    if not any(name in config for name in SPEEDUPS):
        return "none"  # summaries from before the speed-ups: the original's step
    on = [name for name in SPEEDUPS if config.get(name) not in (False, "off", None)
          and not (one_rank and BY_NAME[name].several_ranks)]
    return ",".join(on) or "none"


# Column name -> its value in a summary. Older summaries lack some keys: their defaults
# are what those runs did (PyTorch's DataLoader, one process).
FIELDS = {
    "batch": _config("batch_size"),
    "image size": _config("image_size"),
    "capacity": _config("max_boxes"),
    "hidden": _config("hidden"),
    "amp": _config("amp"),
    "compile": _config("compile"),
    "loader": _config("loader", "torch"),
    "seed": _config("seed"),
    "speed-ups asked": _speedups_asked,
    "ranks": lambda s: (s.get("distributed") or {}).get("world", 1),
    # How several ranks split lin1 (training/parallel.py); DDP before the switch existed.
    "parallel": lambda s: (s.get("distributed") or {}).get("parallel", "ddp")
    if s.get("distributed") else "-",
    "device": lambda s: (s.get("environment") or {}).get("device"),
}


# What a one-GPU baseline must share with a job of several ranks (make scaling's
# --scaling-baseline, make throughput's --against): every field but the ranks, the design
# and the device (known once the job has run), and of the speed-ups those one GPU can ask
# for: tp's graphed head is the design's, as "parallel" is.
BASELINE_FIELDS = {**{name: read for name, read in FIELDS.items()
                      if name not in ("ranks", "parallel", "device")},
                   "speed-ups asked": lambda s: _speedups_asked(s, one_rank=True)}


def baseline_differences(baseline: dict, job: dict) -> dict:
    """{field: (the baseline's value, the job's)} for the BASELINE_FIELDS where they differ."""
    return differences(baseline, job, fields=BASELINE_FIELDS)


def fields_of(summary: dict, fields: dict = FIELDS) -> dict:
    return {name: read(summary) for name, read in fields.items()}


def differing(summaries: list[dict]) -> list[str]:
    """The FIELDS whose values are not the same in every summary, in FIELDS' order."""
    values = [fields_of(s) for s in summaries]
    return [name for name in FIELDS if len({repr(v[name]) for v in values}) > 1]


def differences(a: dict, b: dict, names=None, fields: dict = FIELDS) -> dict:
    """{field: (a's value, b's value)} for the fields named (default: all of `fields`),
    each read once, where a and b differ."""
    chosen = fields if names is None else {name: fields[name] for name in names}
    fa, fb = fields_of(a, chosen), fields_of(b, chosen)
    return {name: (fa[name], fb[name]) for name in chosen if fa[name] != fb[name]}


def describe(diffs: dict) -> str:
    """differences(there, here) as 'batch 8 there, 64 here; image size 64 there, 128 here'."""
    return "; ".join(f"{name} {x} there, {y} here" for name, (x, y) in diffs.items())
