"""One home for every list of names: strategies, kernel backends, modes, profiler phases.
Everything else (the registry, the command line, make compare, the tests) imports them."""

from dataclasses import dataclass

from core.errors import UserError

# How a strategy lays out a batch's targets (data/collate.py): a list of per-sample
# [n_i, 4] tensors; [B, M, 4] and the counts; every box in one [N, 4], N per batch.
LAYOUTS = ("list", "padded", "packed")


@dataclass(frozen=True)
class Traits:
    """One loss strategy's record: where its maker lives, and every fact about it that the
    rest of the project checks. Torch-free: train.py --help reads it without torch."""
    maker: str                # "module:function" that makes it (losses/, imported on use)
    layout: str               # one of LAYOUTS
    fused: bool = False       # its kernels come in each of BACKENDS (Triton, CUDA C++)
    host_bound: bool = False  # its step waits on the host's Python (per sample, or the
    #                           nested tensors'): the GPU idles half of each step or more
    #                           over an epoch (results/step.md)
    syncs: bool = False       # its loss waits for the device: no CUDA graph can hold it
    compiled: bool = False    # torch.compile writes its kernels: its first call compiles

    def __post_init__(self):
        if self.layout not in LAYOUTS:
            raise ValueError(f"layout {self.layout!r} is none of {LAYOUTS}")


# The loss strategies, in the order tables list them: a new one is a file in losses/ and
# one line here. None syncs with the host (results/strategies.md: 0 syncs in a train step).
REGISTRY = {
    "loop": Traits("losses.loop:make", "list", host_bound=True),
    "concat": Traits("losses.concat:make", "list", host_bound=True),
    "padded": Traits("losses.padded:make", "padded"),
    "compiled": Traits("losses.compiled:make", "padded", compiled=True),
    "kernel": Traits("losses.fused:make_kernel", "padded", fused=True),
    "conditional": Traits("losses.fused:make_conditional", "padded", fused=True),
    "packed": Traits("losses.packed:make", "packed", fused=True),
    "nested": Traits("losses.nested:make", "packed", host_bound=True),
    "compiled_packed": Traits("losses.compiled_packed:make", "packed", compiled=True),
}
STRATEGIES = tuple(REGISTRY)
# The lists the checks read, each derived from the records.
RAGGED = tuple(n for n, t in REGISTRY.items() if t.layout == "list")
PACKED = tuple(n for n, t in REGISTRY.items() if t.layout == "packed")
HOST_BOUND = tuple(n for n, t in REGISTRY.items() if t.host_bound)
FUSED = tuple(n for n, t in REGISTRY.items() if t.fused)
COMPILED = tuple(n for n, t in REGISTRY.items() if t.compiled)
BACKENDS = ("triton", "cuda")            # the fused kernels' implementations


def traits(name: str) -> Traits:
    """A strategy's record; an unknown name raises (never a default layout)."""
    if name not in REGISTRY:
        raise UserError(f"unknown loss strategy {name!r}: choose one of "
                        f"{', '.join(STRATEGIES)}")
    return REGISTRY[name]

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
