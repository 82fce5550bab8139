"""Runs' losses side by side, step by step: a CSV (step, then a column a run) and a chart
(studies/charts.loss_curves_chart), with each run's largest and mean relative gap from the
first run printed. For a speed-up that changes the maths (--float8-lin1) against the step
it replaces, over the same seed and batches.

    python3 bench/loss_curves.py --out results/float8-losses bf16=RUN_FOLDER float8=RUN_FOLDER

writes results/float8-losses.csv and results/float8-losses.png (--png elsewhere).
"""

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from core.errors import UserError  # noqa: E402
from core.files import write_whole  # noqa: E402
from studies.charts import loss_curves_chart, where_of  # noqa: E402
from studies.compare_rows import load_summary  # noqa: E402


def parse_runs(given: list[str]) -> list[tuple[str, dict]]:
    """[(label, summary)] of label=run-folder arguments."""
    runs = []
    for item in given:
        label, sep, folder = item.partition("=")
        if not sep or not label or not folder:
            raise UserError(f"{item!r}: give each run as label=run-folder")
        summary = load_summary(Path(folder))
        if not summary.get("losses"):
            raise UserError(f"{folder}: its summary.json holds no losses (a train.py run's "
                            "folder has them)")
        runs.append((label, summary))
    return runs


def gaps(base: list[float], losses: list[float]) -> tuple[float, float]:
    """(largest, mean) |loss - base| / |base| over the steps both have."""
    rel = [abs(y - x) / abs(x) for x, y in zip(base, losses) if x]
    return max(rel), sum(rel) / len(rel)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="the CSV's path without .csv")
    parser.add_argument("--png", help="the chart's path (default: --out with .png)")
    parser.add_argument("runs", nargs="+", help="label=run-folder, the first the baseline")
    args = parser.parse_args(argv)
    try:
        runs = parse_runs(args.runs)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    curves = [(label, s["losses"]) for label, s in runs]
    steps = max(len(losses) for _, losses in curves)
    lines = ["step," + ",".join(label for label, _ in curves)]
    for i in range(steps):
        lines.append(f"{i + 1}," + ",".join(f"{losses[i]:.7g}" if i < len(losses) else ""
                                             for _, losses in curves))
    out = Path(args.out)
    write_whole(out.with_suffix(".csv"), "\n".join(lines) + "\n")
    png = Path(args.png) if args.png else out.with_suffix(".png")
    loss_curves_chart(curves, png, where_of(s.get("environment") for _, s in runs))
    for label, losses in curves[1:]:
        largest, mean = gaps(curves[0][1], losses)
        print(f"{label} against {curves[0][0]}: {len(losses)} steps, the largest gap "
              f"{largest:.3%} of the loss, the mean {mean:.3%}")
    print(f"written: {out.with_suffix('.csv')}, {png}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
