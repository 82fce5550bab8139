"""make ladder: the train step's speed-ups added one at a time, each rung a profiled run.

    python3 -m profiling.run_ladder [--strategies padded,kernel:cuda] [train.py options...]

Rung 0 is --baseline (the step as the original ran it); rung k adds the k-th speed-up of
core.names.SPEEDUPS to rung k-1. Every run has the same seed, so the same batches and
initial weights. Written under profiles/ladder-<UTC time>/: a run folder per strategy and
rung, ladder.md and ladder.csv (step GPU and CPU ms, each phase's GPU ms, launches per
step, peak memory, the first three losses, the run folder), ladder-kernels.md (per rung,
the kernels whose time changed most against the rung before: what the speed-up removed or
shortened) and ladder.png. A speed-up that cannot run here (GPU-only ones on a CPU, a CUDA
graph of a ragged strategy) is a row that says why, and the rungs after it go on without.
"""

import argparse
import csv
import io
import json
import subprocess
import sys
import time
from pathlib import Path

from core.names import BACKENDS, GPU_ONLY_SPEEDUPS, PHASES, SPEEDUPS, describe
from errors import UserError, exit_with, one_line
from profiling.compare import load_summary, to_markdown
from profiling.run_comparison import (CompareError, SKIPPED, _check_strategies, _fresh_out,
                                      attempt)
from profiling.run_folder import display
from training import speedups

GOAL_MS = 30.0  # the step's goal on the H100 (issue 11), drawn on the chart
# Set per rung: given in ARGS they would make the rungs the same.
PER_RUN_OPTIONS = ("--loss", "--backend", "--kernel", "--mode", "--run-name", "--out-dir",
                   "--baseline", "--no-baseline",
                   *[f"--{p}{s.replace('_', '-')}" for s in SPEEDUPS for p in ("", "no-")])
COLUMNS = (["strategy", "rung", "step GPU ms", "step CPU ms", "saved GPU ms"]
           + [f"{p} GPU ms" for p in PHASES]
           + ["launches", "peak GPU GB", "first losses", "run folder"])


def rung_flags(speedup: str) -> list[str]:
    """The option that turns one speed-up on."""
    flag = "--" + speedup.replace("_", "-")
    return [flag, "on"] if speedup == "cuda_graph" else [flag]


def why_not_here(speedup: str, loss: str, cuda: bool, train_args: list[str]) -> str | None:
    """Why a speed-up cannot be added for this strategy on this machine, or None."""
    if speedup in GPU_ONLY_SPEEDUPS and not cuda:
        return "needs a CUDA GPU"
    if speedup == "cuda_graph":
        import train
        cfg = train.parse_config(["--loss", loss, "--baseline", *train_args])
        return speedups.graph_refusal(cfg, cuda)
    return None


# cuDNN keeps, per process, the algorithm it first chose for a convolution's shapes and
# layout, whatever torch.backends.cudnn.benchmark says later: a benchmarked rung after a
# baseline in one process would measure the baseline's choices. So the rungs run in two
# processes: the baselines (heuristics) in one, every rung with cudnn_benchmark in another.
GROUPS = {"heuristics": ("baseline",), "tuned": SPEEDUPS}


def run_ladder(out: Path, train_args: list[str], strategies: list[str],
               rungs=("baseline", *SPEEDUPS)):
    """Runs the given rungs of every strategy, each rung adding its speed-up to every
    speed-up before it; returns (run folders by (strategy, rung), rows of rungs that could
    not run)."""
    import torch
    from kernels.cuda_giou import unavailable_reason
    cuda = torch.cuda.is_available()
    runs, skipped, started = {}, [], time.time()
    for strategy in strategies:
        loss, _, backend = strategy.partition(":")
        name = _label(strategy)
        flags = ["--baseline"]
        for number, rung in enumerate(("baseline", *SPEEDUPS)):
            if rung not in rungs:
                if rung != "baseline" and not why_not_here(rung, loss, cuda, train_args):
                    flags += rung_flags(rung)  # the rungs below this one stay on
                continue
            label = f"[{name} {number}/{len(SPEEDUPS)}] {rung}"
            reason = unavailable_reason() if backend == "cuda" else None
            if reason is None and rung != "baseline":
                reason = why_not_here(rung, loss, cuda, train_args)
            if reason:
                print(f"{label}: skipped ({reason})", flush=True)
                skipped.append({"strategy": name, "rung": _rung_name(rung),
                                "step GPU ms": f"skipped: {reason}"})
                continue
            if rung != "baseline":
                flags += rung_flags(rung)
            args = ["--loss", loss, "--backend", backend or BACKENDS[0], "--mode", "train",
                    "--out-dir", str(out), "--run-name",
                    f"{strategy.replace(':', '-')}-{number}-{rung}", *flags, *train_args]
            print(f"{label} ({time.time() - started:.0f} s so far)", flush=True)
            record, reason = attempt(args, label)
            if record is None:
                skipped.append({"strategy": name, "rung": _rung_name(rung),
                                "step GPU ms": reason})
                continue
            runs[(name, _rung_name(rung))] = Path(record["run_dir"])
    return runs, skipped


def run_groups(out: Path, train_args: list[str], strategies: list[str]):
    """Every rung, each group of GROUPS in a process of its own (this module's --group);
    returns what run_ladder returns, over all groups, in ladder order."""
    started = time.time()
    runs, skipped = {}, []
    for group in GROUPS:
        code = subprocess.call([sys.executable, "-m", "profiling.run_ladder", "--group", group,
                                "--strategies", ",".join(strategies), "--out", str(out),
                                *train_args])
        if code == 130:
            raise KeyboardInterrupt("interrupted")
        done = out / f"rungs-{group}.json"
        if code != 0 or not done.exists():
            skipped += [{"strategy": _label(s), "rung": _rung_name(r),
                         "step GPU ms": f"the run failed: its process ended with exit {code}"}
                        for s in strategies for r in GROUPS[group]]
            continue
        record = json.loads(done.read_text())
        runs.update({(s, r): Path(p) for s, r, p in record["runs"]})
        skipped += record["skipped"]
    print(f"all rungs done in {time.time() - started:.0f} s", flush=True)
    order = ["baseline", *(_rung_name(r) for r in SPEEDUPS)]
    names = [_label(s) for s in strategies]
    return dict(sorted(runs.items(), key=lambda kv: (names.index(kv[0][0]),
                                                      order.index(kv[0][1])))), skipped


def _label(strategy: str) -> str:
    """'kernel:cuda' -> 'kernel/cuda', 'padded' -> 'padded': how the tables name it."""
    loss, _, backend = strategy.partition(":")
    return describe(loss, backend or BACKENDS[0])


def _rung_name(rung: str) -> str:
    return rung if rung == "baseline" else f"+ {rung}"


def ladder_rows(runs: dict, skipped: list[dict]) -> list[dict]:
    """One row per rung, in the order the runs were made, skipped ones where they fell."""
    rows, previous = [], {}
    summaries = {key: load_summary(path) for key, path in runs.items()}
    for (strategy, rung), s in summaries.items():
        on_gpu = s.get("peak_gpu_memory_gb") is not None
        step_gpu = s["step"]["gpu_ms"] if on_gpu else None
        row = {"strategy": strategy, "rung": rung, "step GPU ms": step_gpu,
               "step CPU ms": s["step"]["cpu_ms"],
               "saved GPU ms": (previous[strategy] - step_gpu
                                if on_gpu and strategy in previous else None)}
        for phase, p in s["phases"].items():
            row[f"{phase} GPU ms"] = p["gpu_ms"] if on_gpu else None
        row.update({
            "launches": sum(p["launches"] for p in s["phases"].values()) if on_gpu else None,
            "peak GPU GB": s.get("peak_gpu_memory_gb"),
            "first losses": " ".join(f"{v:.4f}" for v in s["losses"][:3]),
            "run folder": display(runs[(strategy, rung)].absolute()),
        })
        if on_gpu:
            previous[strategy] = step_gpu
        rows.append(row)
    rows += skipped
    rung_order = ["baseline", *(_rung_name(r) for r in SPEEDUPS)]
    strategy_order = list(dict.fromkeys(r["strategy"] for r in rows))
    rows.sort(key=lambda r: (strategy_order.index(r["strategy"]), rung_order.index(r["rung"])))
    return rows


def short_kernel_name(name: str, width: int = 150) -> str:
    """A kernel's name without the namespaces that every ATen kernel shares, cut to width:
    the template arguments that tell two multi_tensor_apply kernels apart stay."""
    for noise in ("void ", "at::native::", "(anonymous namespace)::", "at::"):
        name = name.replace(noise, "")
    return name if len(name) <= width else name[:width - 1] + "…"


def kernel_changes(runs: dict, limit: int = 6) -> str:
    """Per rung, the kernels whose GPU time per step changed most against the rung before
    (from each run's top kernels): which kernels a speed-up removed, shortened or added."""
    lines = ["# Where each speed-up's time went", "",
             "GPU ms per step of the kernels that changed most against the rung before "
             "(from each run's top kernels; a kernel outside a run's top list counts as 0).",
             ""]
    previous = {}
    for (strategy, rung), path in runs.items():
        kernels = {k["name"]: k["gpu_ms"] for k in load_summary(path).get("top_kernels", [])}
        before = previous.get(strategy)
        previous[strategy] = kernels
        if before is None or not (kernels or before):
            continue
        deltas = sorted(((kernels.get(n, 0.0) - before.get(n, 0.0), n)
                         for n in set(kernels) | set(before)), key=lambda d: -abs(d[0]))
        lines += [f"## {strategy} {rung}", "", "| change ms | before ms | after ms | kernel |",
                  "|---:|---:|---:|---|"]
        for delta, n in deltas[:limit]:
            lines.append(f"| {delta:+.3f} | {before.get(n, 0.0):.3f} | "
                         f"{kernels.get(n, 0.0):.3f} | `{short_kernel_name(n)}` |")
        lines.append("")
    return "\n".join(lines)


def ladder_chart(rows: list[dict], path: Path) -> None:
    """Step time per rung, one bar group per strategy; GPU time where there is a GPU (with
    the 30 ms goal), CPU time otherwise."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [r for r in rows if isinstance(r.get("step CPU ms"), float)]
    on_gpu = any(isinstance(r.get("step GPU ms"), float) for r in measured)
    key = "step GPU ms" if on_gpu else "step CPU ms"
    strategies = list(dict.fromkeys(r["strategy"] for r in measured))
    rungs = list(dict.fromkeys(r["rung"] for r in measured))
    fig, ax = plt.subplots(figsize=(max(7, 1.6 * len(rungs)), 4.5))
    width = 0.8 / max(len(strategies), 1)
    for i, strategy in enumerate(strategies):
        by_rung = {r["rung"]: r[key] for r in measured if r["strategy"] == strategy}
        xs = [j + (i - (len(strategies) - 1) / 2) * width for j, rung in enumerate(rungs)
              if rung in by_rung]
        values = [by_rung[rung] for rung in rungs if rung in by_rung]
        ax.bar(xs, values, width=width, label=strategy)
        for x, v in zip(xs, values):
            ax.annotate(f"{v:.3g}", (x, v), ha="center", va="bottom", fontsize=7)
    if on_gpu:
        ax.axhline(GOAL_MS, color="gray", linestyle="--", linewidth=1)
        ax.annotate(f"goal {GOAL_MS:g} ms", (len(rungs) - 0.6, GOAL_MS), va="bottom",
                    fontsize=8, color="gray")
    ax.set_xticks(range(len(rungs)), rungs, rotation=20)
    ax.set_ylabel(f"{key.replace(' ms', '')} ms per step")
    ax.set_title("train step, speed-ups added one at a time" +
                 ("" if on_gpu else " (CPU preset: the times say little)"))
    if measured:
        ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_ladder(out: Path, runs: dict, skipped: list[dict]) -> str:
    rows = ladder_rows(runs, skipped)
    columns = [c for c in COLUMNS if any(c in r for r in rows)]
    table = to_markdown(rows, columns)
    (out / "ladder.md").write_text(table + "\n")
    text = io.StringIO()
    writer = csv.DictWriter(text, columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    (out / "ladder.csv").write_text(text.getvalue())
    (out / "ladder-kernels.md").write_text(kernel_changes(runs))
    ladder_chart(rows, out / "ladder.png")
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("--strategies", default="padded,kernel:cuda",
                        help="comma-separated, <loss>[:<kernel backend>]")
    parser.add_argument("--out", type=Path, help="a new folder for the ladder "
                        "(default: profiles/ladder-<time>/)")
    parser.add_argument("--group", choices=tuple(GROUPS), help=argparse.SUPPRESS)
    args, train_args = parser.parse_known_args(argv)
    strategies = args.strategies.split(",")
    if args.group:  # a worker of run_groups: its rungs, into the ladder's folder
        runs, skipped = run_ladder(args.out, train_args, strategies, GROUPS[args.group])
        (args.out / f"rungs-{args.group}.json").write_text(json.dumps(
            {"runs": [[s, r, str(p)] for (s, r), p in runs.items()], "skipped": skipped}))
        return 0
    try:
        _check_strategies(strategies)
        for arg in train_args:
            if arg.split("=", 1)[0] in PER_RUN_OPTIONS:
                raise CompareError(f"{arg.split('=', 1)[0]} is set per rung by make ladder; "
                                   "choose strategies with --strategies")
        import train
        train.validate(train.parse_config(["--baseline", *train_args]))
        out = _fresh_out(args.out, kind="ladder", prefix="ladder")
    except (CompareError, UserError) as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    runs, skipped = run_groups(out, train_args, strategies)
    (out / SKIPPED).write_text(json.dumps(skipped, indent=1) + "\n")
    print(write_ladder(out, runs, skipped))
    print(f"written: {display(out / 'ladder.md')}, ladder.csv, ladder-kernels.md, ladder.png")
    failed = [r for r in skipped if str(r.get("step GPU ms", "")).startswith("the run failed")]
    if failed or not runs:
        print(f"error: {len(failed)} rungs failed, {len(runs)} ran (the rows say why)",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    exit_with(main, "the ladder was not written")
