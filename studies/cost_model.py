"""make costmodel: each --parallel design's step on N GPUs, predicted from what one GPU
measured (bench/sharded_rank.py's JSON) and the links' bandwidths, with the bytes every
rank moves per step; the design it picks at each N.

    python3 -m studies.cost_model [--measured results/sharded_rank-h200.json | --measure]
        [--worlds 2,4,8,16,64] [--gpus-per-host 8] [--nvlink-gbs 341] [--network-gbs 50]
        [--chart scaling.png] [--out folder]

The model whole: docs/several-gpus.md ("The cost model"); the design in full:
docs/design.md, this module's section."""

import argparse
import json
import math
from dataclasses import dataclass
from pathlib import Path

from core.commands import command, run_command
from core.errors import UserError
from core.run_folder import display

BF16, FP32 = 2, 4
# tp2d: tp inside each host, data-parallel across hosts (--parallel tp2d; on one host it is
# tp).
DESIGNS = ("ddp", "zero", "tp", "tp2d")
# Two H200s, NVLink: the 4.36 GB fp32 all-reduce took 12.8 ms, 341 GB/s of bus bandwidth
# (shared/WORKLOAD.md); its bf16 2.15 GB all-reduce 6.8 ms under DDP (results/several-gpus.md).
NVLINK_GBS = 341.0
# Across hosts: one 400 Gb/s NIC per GPU, NCCL's bus bandwidth about 50 GB/s. Stated, not
# measured here (no machine of several hosts is lent).
NETWORK_GBS = 50.0
# The two-H200 DDP run at 025ba23 (results/several-gpus.md): its step 22.21 ms against one
# GPU's 18.03 in the same call, with 6.84 ms of NCCL kernels, 0.42 of them exposed; 0.88 ms
# of the growth is DDP's own cost on a world of one (its bucket copy, bench/sharded_rank.py
# in that call), so hidden NCCL time slowed the kernels beside it by 0.45 of its time.
CONTENTION = (22.21 - 18.03 - 0.88 - 0.42) / (6.84 - 0.42)


# Measured over runs on several GPUs (results/several-gpus.md), beside the predictions:
# (design, GPUs, a rank's median step ms, scaling, where). The H200s' own: the default
# --measured is one of those H200s. ddp on 2 is the run CONTENTION is fitted to. tp on 2:
# its default since 3c02f18, the collectives by copy engine (the model counts NCCL's bytes).
MEASURED = [("tp", 2, 16.78, 2.16, "2 H200s, 3c02f18, copy engines"),
            ("ddp", 2, 22.21, 1.63, "2 H200s, 025ba23, contention fitted"),
            ("zero", 2, 23.23, 1.56, "2 H200s, 025ba23"),
            ("tp", 4, 17.60, 4.06, "4 H200s, 1f13790"),
            ("ddp", 4, 25.18, 2.89, "4 H200s, 1f13790"),
            ("zero", 4, 23.38, 3.10, "4 H200s, 1f13790")]
# The columns that are the model's output, not a measurement: the table says so.
PREDICTED = ("compute ms", "NCCL ms", "exposed ms", "step ms", "scaling")


@dataclass(frozen=True)
class Shape:
    batch: int = 1024      # samples a rank
    features: int = 65536  # lin1's input: 256 x 16 x 16 at 256 x 256 images
    hidden: int = 16384
    out: int = 1024        # 256 boxes x 4
    conv_params: int = 4 * 9 + 4 + 16 * 4 * 9 + 16 + 64 * 16 * 9 + 64 + 256 * 64 * 9 + 256


def ring(kind: str, size: float, n: int, gbs: float) -> float:
    """ms of a ring collective over n ranks: an all-reduce of `size` bytes, or an
    all-gather / reduce-scatter whose result (input) is `size` bytes in all."""
    if n < 2 or size <= 0:
        return 0.0
    factor = 2 * (n - 1) / n if kind == "all-reduce" else (n - 1) / n
    return factor * size / (gbs * 1e9) * 1e3


def collectives(design: str, n: int, s: Shape, g: int = 8
                ) -> list[tuple[str, str, float, str]]:
    """(name, kind, bytes in all, when) per step: when is 'hidden' (beside the backward),
    'forward' (beside the conv forward), 'backward' (beside the conv backward) or
    'exposed'; 'hidden-across' is hidden but crosses hosts among n / g of them (tp2d,
    g GPUs a host)."""
    lin1_grad = s.hidden * s.features * BF16  # bf16 under --bf16-shadow
    replicated = (s.conv_params + s.hidden + s.out * s.hidden + s.out) * FP32
    if design == "ddp":
        return [("every gradient", "all-reduce", lin1_grad + replicated, "hidden")]
    if design == "zero":
        return [("lin1 weight (bf16)", "all-gather", lin1_grad, "forward"),
                ("lin1 gradient", "reduce-scatter", lin1_grad, "backward"),
                ("the other gradients", "all-reduce", replicated, "hidden")]
    if design == "tp2d":  # tp inside each host of g GPUs, data-parallel across hosts
        return collectives("tp", min(n, g), s) + [
            ("lin1 and lin2 shards' gradients, across hosts", "all-reduce",
             (s.hidden * s.features * BF16 + (s.hidden + s.out * s.hidden) * FP32) / min(n, g),
             "hidden-across")]
    features = n * s.batch * s.features * BF16  # the global batch's, gathered
    outputs = n * s.batch * s.out * BF16
    return [("features", "all-gather", features, "own-rows"),
            ("features' gradient", "reduce-scatter", features, "dW"),
            ("lin2 output", "reduce-scatter", outputs, "exposed"),
            ("lin2 output's gradient", "all-gather", outputs, "exposed"),
            ("conv and lin2-bias gradients", "all-reduce",
             (s.conv_params + s.out) * FP32, "hidden")]


def _ring_size(n: int, g: int, when: str) -> int:
    """How many ranks a collective's ring holds: tp2d's gathers stay inside a host of g,
    its gradient all-reduce spans the n / g hosts."""
    return max(n // g, 1) if when == "hidden-across" else n


def sent_per_rank(design: str, n: int, s: Shape, g: int = 8) -> float:
    """Bytes one rank sends per step (a ring's all-gather or reduce-scatter sends (N-1)/N of
    the whole, an all-reduce twice that)."""
    total = 0.0
    for _, kind, size, when in collectives(design, n, s, g):
        k = _ring_size(n, g, when) if design == "tp2d" else n
        total += size * (k - 1) / k * (2 if kind == "all-reduce" else 1)
    return total


def _pieces(measured: dict, n: int) -> dict:
    """bench/sharded_rank.py's pieces at n ranks; where n was not measured, one GPU's with
    the shadow SGD over H/n rows (it scales with the rows) and the same GEMMs."""
    by_world = {p["world"]: p for p in measured["pieces"]}
    if n in by_world:
        return by_world[n]
    one = by_world[1]
    return {**one, "world": n, "shadow SGD ms (H/N rows)": one["shadow SGD ms (H/N rows)"] / n}


def windows(measured: dict, n: int) -> dict:
    """ms of compute that a hidden collective can run beside: the conv forward (~2 ms) for
    zero's all-gather, the backward after lin1 (~7 ms) for the gradients' reductions (both
    from the one-GPU step's kernels); tp's own rows' GEMM (1/n of lin1's forward at n) and
    lin1's dW GEMM at n (measured)."""
    rank = _pieces(measured, n)
    return {"forward": 2.0, "backward": 7.0, "hidden": 7.0, "hidden-across": 7.0,
            "own-rows": rank["lin1 fwd"] / n, "dW": rank["lin1 dW"]}


def steps_at(measured: dict, world: int) -> dict:
    """design -> a rank's measured step ms on `world` ranks: 1, a world of one; more, rank
    0 of a fake world (bench/sharded_rank.py's table D). Failed designs (nan) left out."""
    return {r["design"]: r["step ms median"] for r in measured["steps"]
            if r.get("world", 1) == world and math.isfinite(r["step ms median"])}


def compute_ms(design: str, shards: int, measured: dict) -> float:
    """A rank's step without its collectives: as measured on a fake world of `shards`
    (tp's with its graphed head, the default), or else the design's step on a world of
    one, with the shadow SGD over 1/shards of lin1's rows (and a tp rank's GEMMs at its
    shapes)."""
    own = "tp" if design == "tp2d" else design
    at_n = steps_at(measured, shards) if shards > 1 else {}
    rank = at_n.get(f"{own}-graphed", at_n.get(own))
    if rank is not None:
        return rank
    steps = steps_at(measured, 1)
    if design == "ddp":
        return steps["ddp"]
    one, rank = _pieces(measured, 1), _pieces(measured, shards)
    full_sgd, sgd_n = one["shadow SGD ms (H/N rows)"], rank["shadow SGD ms (H/N rows)"]
    if f"{own}-inline" in steps:  # the update beside the trunk, as measured
        hidden_on_one = max(0.0, steps[f"{own}-inline"] - steps[own])
        compute = steps[f"{own}-inline"] - full_sgd + max(0.0, sgd_n - hidden_on_one)
    else:
        compute = steps[own] - (full_sgd - sgd_n)
    if own == "tp":  # its GEMMs at N·B samples and H/N rows: the same FLOPs, other shapes
        compute += (rank["lin1 GEMMs ms"] - one["lin1 GEMMs ms"] +
                    rank["lin2 GEMMs ms"] - one["lin2 GEMMs ms"])
    return compute


def predict(design: str, n: int, measured: dict, s: Shape, per_host: int, nvlink: float,
            network: float) -> dict:
    """The predicted step of one rank of `design` on n GPUs."""
    shards = min(n, per_host) if design == "tp2d" else n  # tp2d shards inside a host
    compute = compute_ms(design, shards, measured)
    window = windows(measured, shards)
    exposed = hidden = 0.0
    for _, kind, size, when in collectives(design, n, s, per_host):
        k = _ring_size(n, per_host, when) if design == "tp2d" else n
        crosses = n > per_host and (design != "tp2d" or when == "hidden-across")
        t = ring(kind, size, k, network if crosses else nvlink)
        room = window.get(when, float("inf")) if when != "exposed" else 0.0
        exposed += max(0.0, t - room)
        hidden += min(t, room)
    step = compute + exposed + CONTENTION * hidden
    one = steps_at(measured, 1)["one"]
    return {"design": design, "GPUs": n, "compute ms": compute, "NCCL ms": exposed + hidden,
            "exposed ms": exposed, "step ms": step, "GB sent a rank": sent_per_rank(
                design, n, s, per_host) / 1e9, "scaling": n * one / step}


def table(rows: list[dict]) -> str:
    """The predictions, each predicted column named so, with what a run measured for the
    same design and GPUs beside them: its median step, how far the prediction is from it,
    and its scaling."""
    keys = list(rows[0])
    heads = [f"predicted {k}" if k in PREDICTED else k for k in keys] + [
        "measured step ms (predicted off by; scaling; where)"]
    fmt = (lambda v: f"{v:.2f}" if isinstance(v, float) else str(v))
    return "\n".join(["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)] +
                      ["| " + " | ".join([fmt(r[k]) for k in keys] + [measured(r)]) + " |"
                       for r in rows])


def measured(row: dict) -> str:
    """What runs measured for row's design on as many GPUs ('-' where none did)."""
    found = [f"{step:.2f} ({row['step ms'] / step - 1:+.1%}; {factor:.2f}x; {where})"
             for design, n, step, factor, where in MEASURED
             if design == row["design"] and n == row["GPUs"]]
    return "; ".join(found) or "-"


def parse_worlds(text: str) -> list[int]:
    """--worlds as numbers of GPUs, each 2 or more; one line naming what is not."""
    worlds = []
    for part in text.split(","):
        if not part.strip().isdigit():
            raise UserError(f"--worlds {text}: {part.strip()!r} is not a whole number of GPUs "
                            "(e.g. --worlds 2,4,8)")
        worlds.append(int(part))
    if any(n < 2 for n in worlds):
        raise UserError("--worlds are numbers of GPUs, 2 or more")
    return worlds


def chart(rows: list[dict], path: Path, title: str) -> None:
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    fig, ax = plt.subplots(figsize=(7, 4.5))
    worlds = sorted({r["GPUs"] for r in rows})
    for design in DESIGNS:
        ax.plot(worlds, [next(r["scaling"] for r in rows if r["GPUs"] == n and
                              r["design"] == design) for n in worlds], marker="o",
                label=f"{design} (predicted{'; modelled, not built' if design == 'tp2d' else ''})")
    for design, n, _, factor, where in MEASURED:
        ax.plot([n], [factor], "kx", markersize=9)
        ax.annotate(f"{design} measured: {factor}x ({where})", (n, factor),
                    textcoords="offset points", xytext=(8, -12), fontsize=8)
    ax.plot(worlds, worlds, "k:", label="N x one GPU")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log", base=2)
    ax.set_xlabel("GPUs")
    ax.set_ylabel("samples/s against one GPU")
    ax.set_title(title, fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _check_machine(args) -> None:
    """The machine's numbers: whole hosts, and bandwidths that are positive numbers (a 0
    raised ZeroDivisionError, a negative one gave negative times, nan made ddp best
    everywhere)."""
    if args.gpus_per_host < 1:
        raise UserError(f"--gpus-per-host must be 1 or more, not {args.gpus_per_host}")
    for flag, value in (("--nvlink-gbs", args.nvlink_gbs), ("--network-gbs", args.network_gbs)):
        if not (math.isfinite(value) and value > 0):
            raise UserError(f"{flag} must be a positive number of GB/s, not {value}")


def cannot_apply(design: str, n: int, hidden: int, per_host: int) -> str | None:
    """Why --parallel `design` refuses n GPUs at lin1's `hidden` rows (the rules of
    training/parallel.check), or None: the sharded designs split the rows evenly over
    their ranks (tp2d over a host's), and tp2d needs whole hosts."""
    if design == "ddp":
        return None
    parts = min(n, per_host) if design == "tp2d" else n
    if design == "tp2d" and n % parts:
        return f"{n} GPUs are not whole hosts of {parts}"
    if hidden % parts:
        return f"lin1's {hidden} rows do not split evenly over {parts} ranks"
    return None


DEFAULT_MEASURED = "results/sharded_rank-h200.json"


def measure_here() -> str:
    """Runs bench/sharded_rank.py on this machine's GPU (kernel/cuda, every design, the
    pieces at 1, 2, 4 and 8 ranks, rank 0 of fake worlds of 2 and 4) into profiles/;
    returns the JSON's path."""
    import subprocess
    import sys

    import torch
    if not torch.cuda.is_available():
        raise UserError("--measure needs a CUDA GPU; on this machine name a measured JSON "
                        f"with --measured (the default: {DEFAULT_MEASURED})")
    out = Path("profiles") / "sharded_rank.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    print(f"measuring a rank's work per design on this GPU (bench/sharded_rank.py, about "
          f"three minutes) into {out}", flush=True)
    done = subprocess.run([sys.executable, "bench/sharded_rank.py", "--json", str(out)],
                          stdout=subprocess.DEVNULL)
    if done.returncode:
        raise UserError(f"bench/sharded_rank.py ended {done.returncode}: nothing predicted")
    return str(out)


def read_measured(path: str) -> dict:
    """bench/sharded_rank.py's JSON, or one line naming the file and what is wrong."""
    try:
        measured = json.loads(Path(path).read_text())
        steps = {r["design"]: float(r["step ms median"]) for r in measured["steps"]
                 if r.get("world", 1) == 1}
        pieces = {p["world"]: p for p in measured["pieces"]}
        missing = [d for d in ("one", *DESIGNS[:3]) if d not in steps] + (
            [] if 1 in pieces else ["the pieces at one rank"])
    except (OSError, ValueError) as exc:
        raise UserError(f"--measured {path}: {exc}") from None
    except (KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"--measured {path}: not bench/sharded_rank.py's JSON "
                        f"({type(exc).__name__}: {exc})") from None
    if missing:
        raise UserError(f"--measured {path}: no step measured for {', '.join(missing)}")
    return measured


def _main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="make costmodel", description=__doc__.split("\n\n")[0],
                                 allow_abbrev=False)
    ap.add_argument("--measured", default=DEFAULT_MEASURED,
                    help="bench/sharded_rank.py's JSON (a rank's work, one GPU; default "
                    "%(default)s)")
    ap.add_argument("--measure", action="store_true",
                    help="measure it on this machine's GPU first, at the current commit")
    ap.add_argument("--worlds", default="2,4,8,16,64",
                    help="numbers of GPUs to predict (default %(default)s)")
    ap.add_argument("--gpus-per-host", type=int, default=8, help="default %(default)s")
    ap.add_argument("--nvlink-gbs", type=float, default=NVLINK_GBS,
                    help="NCCL's bus bandwidth inside a host (default %(default)s)")
    ap.add_argument("--network-gbs", type=float, default=NETWORK_GBS,
                    help="NCCL's bus bandwidth across hosts (default %(default)s)")
    ap.add_argument("--chart", default="", help="a PNG of the predicted scaling")
    ap.add_argument("--out", default="", help="a folder for costmodel.md, costmodel.png "
                    "and a page of both (index.html)")
    args = ap.parse_args(argv)
    worlds = parse_worlds(args.worlds)
    _check_machine(args)
    if args.measure:
        args.measured = measure_here()
    measured = read_measured(args.measured)
    s = Shape()
    refused = {(d, n): why for n in worlds for d in DESIGNS
               if (why := cannot_apply(d, n, s.hidden, args.gpus_per_host))}
    rows = [predict(d, n, measured, s, args.gpus_per_host, args.nvlink_gbs,
                    args.network_gbs) for n in worlds for d in DESIGNS
            if (d, n) not in refused]
    if args.chart:  # before the table: a chart that cannot be written is the one line
        try:
            chart(rows, Path(args.chart), f"predicted from {measured.get('device')}")
        except OSError as exc:
            raise UserError(f"--chart {args.chart}: {exc.strerror or exc}") from None
    text = report(rows, refused, measured, args, worlds)
    page = write_out(Path(args.out), text, rows, measured) if args.out else None
    print(text)  # after the files: a folder that cannot be written is the one line
    if args.chart:
        print(f"written: {args.chart}")
    if page is not None:
        print(f"written: {display(page.parent / 'costmodel.md')}, costmodel.png")
        print(f"page: {display(page)} (open it in a browser)")
    return 0


def report(rows: list[dict], refused: dict, measured: dict, args, worlds: list[int]) -> str:
    """What the command prints (and writes with --out): where the prediction comes from,
    the table, the designs not predicted, the best design at each N."""
    one = steps_at(measured, 1)["one"]
    lines = [f"Predicted, not measured: from one GPU's step of {one:.2f} ms ({args.measured}: "
             f"{measured.get('device')}, torch {measured.get('torch')}, "
             f"{measured.get('loss', 'kernel/triton')}, commit "
             f"{(measured.get('commit') or '')[:7] or 'not recorded'}), NVLink "
             f"{args.nvlink_gbs:.0f} GB/s inside a host of {args.gpus_per_host}, network "
             f"{args.network_gbs:.0f} GB/s across, contention {CONTENTION:.2f}; the "
             "measured steps beside them are results/several-gpus.md's\n", table(rows)]
    lines += [f"not predicted: {d} on {n} GPUs ({why}; --parallel {d} refuses it)"
              for (d, n), why in refused.items()]
    lines.append("\nBest design at each N: " + ", ".join(
        f"{n}: {max((r for r in rows if r['GPUs'] == n), key=lambda r: r['scaling'])['design']}"
        for n in worlds))
    return "\n".join(lines)


def write_out(out: Path, text: str, rows: list[dict], measured: dict) -> Path:
    """--out: costmodel.md, costmodel.png and the folder's index.html, in a new folder (or
    one that holds no costmodel.md yet); returns the page's path."""
    from core.files import write_whole
    from profiling import report_page
    if (out / "costmodel.md").exists():
        raise UserError(f"--out {out} already holds a cost model: choose a new folder")
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_whole(out / "costmodel.md", text + "\n")
        chart(rows, out / "costmodel.png", f"predicted from {measured.get('device')}")
        page = report_page.write_study(out, text)
    except OSError as exc:
        raise UserError(f"--out {out}: {exc.strerror or exc}") from None
    return page


main = command(_main)

if __name__ == "__main__":
    run_command(main, "no prediction was written")
