"""One home for every list of names: strategies, kernel backends, modes, profiler phases.
Everything else (the registry, the command line, make compare, the tests) imports them."""

from core.errors import UserError

# The loss strategies, in the order tables list them.
STRATEGIES = ("loop", "concat", "padded", "compiled", "kernel", "conditional", "packed",
              "nested", "compiled_packed")
RAGGED = ("loop", "concat")              # targets stay a list of per-sample tensors
PACKED = ("packed", "nested", "compiled_packed")  # every box in one [N, 4], N per batch
# Their steps wait on the host's Python (per sample, or the nested tensors'): the GPU
# idles half of each step or more over an epoch (results/step.md).
HOST_BOUND = RAGGED + ("nested",)
FUSED = ("kernel", "conditional", "packed")  # the strategies whose kernel backend is chosen
BACKENDS = ("triton", "cuda")            # the fused kernels' implementations

# train: the full step; forward: the original's measurement (forward and loss only, a
# device sync closing each range).
MODES = ("train", "forward")

# The profiler ranges of one step, in the order they run.
FORWARD_PHASES = ("data", "copy", "forward", "loss")
TRAIN_PHASES = FORWARD_PHASES + ("loss_backward", "backward", "optimizer")
# A step replayed from a CUDA graph: forward, loss, backward and optimizer are one replay
# (the host code that records their ranges does not run), so they are one range, "graph".
GRAPH_PHASES = ("data", "copy", "graph")
PHASES = TRAIN_PHASES + ("graph",)


def phases_of(mode: str, graphed: bool = False) -> tuple[str, ...]:
    if graphed:
        return GRAPH_PHASES
    return TRAIN_PHASES if mode == "train" else FORWARD_PHASES


def describe(strategy: str, backend: str) -> str:
    """How tables and folders name a strategy: 'padded', or 'kernel/triton' for the fused
    strategies, whose backend matters."""
    return f"{strategy}/{backend}" if strategy in FUSED else strategy


def variants() -> tuple[str, ...]:
    """Every strategy once, the fused ones once per backend: what make compare runs, as
    'padded' or 'kernel:triton'."""
    plain = [s for s in STRATEGIES if s not in FUSED]
    return tuple(plain + [f"{s}:{b}" for b in BACKENDS for s in FUSED])


def parse_variant(text: str, flag: str = "--strategies") -> tuple[str, str]:
    """A strategy as make compare, ladder and sweep take it, '<loss>[:<backend>]', as
    (loss, backend): 'kernel:cuda' -> ('kernel', 'cuda'), 'padded' -> ('padded',
    'triton'). An unknown loss or backend is a UserError naming `flag`, what the user
    typed (make ladder's LADDER=)."""
    loss, _, backend = text.partition(":")
    if loss not in STRATEGIES or backend not in ("", *BACKENDS):
        raise UserError(f"unknown strategy {text!r} in {flag}: use "
                        f"<loss>[:{'|:'.join(BACKENDS)}] with a loss from "
                        f"{', '.join(STRATEGIES)}")
    if backend and loss not in FUSED:
        raise UserError(f"{loss} has no kernel backend: write {loss}, not {text} "
                        f"(backends are for {', '.join(FUSED)})")
    return loss, backend or BACKENDS[0]


def parse_variants(text: str, flag: str = "--strategies") -> list[tuple[str, str]]:
    """A comma-separated list of strategies (parse_variant); an empty one, or one naming a
    strategy twice, is refused, naming `flag`."""
    variants_given = [v for v in text.split(",") if v]
    if not variants_given:
        raise UserError(f"{flag} is empty: name at least one strategy")
    parsed = [parse_variant(v, flag) for v in variants_given]
    names = [describe(*variant) for variant in parsed]  # padded:cuda is padded
    for i, name in enumerate(names):
        if name in names[:i]:  # it would run twice and keep one
            raise UserError(f"{flag} names {name} twice")
    return parsed
