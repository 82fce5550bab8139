"""make ncu: the loss kernels of a short training run through Nsight Compute, one table.

    python3 -m studies.ncu [--loss kernel --backend cuda] [--out DIR] [train.py options...]
    python3 -m studies.ncu --loss kernel --backend cuda --point 1024,1024,full

The table, ncu's report and the refusals: docs/runs.md ("make ncu"); the run's step times
there are not figures (ncu serialises and replays the kernels). The design in full:
docs/design.md, this module's section."""

import argparse
import csv
import math
import os
import shutil
import subprocess
import sys
import tempfile
from collections import defaultdict
from pathlib import Path

from core.commands import command, run_command
from core.errors import ProjectError, UserError
from core.files import write_whole
from core.names import BACKENDS, FUSED
from core.run_folder import display
from core.tables import csv_text, markdown_of_dicts
from studies.common import folder_name, fresh_out

KERNELS = r"regex:giou|packed_(fwd|bwd|finalize)"
METRICS = {
    "gpu__time_duration.sum": "duration us",
    "dram__throughput.avg.pct_of_peak_sustained_elapsed": "DRAM % of peak",
    "sm__warps_active.avg.pct_of_peak_sustained_active": "achieved occupancy %",
    "launch__registers_per_thread": "registers a thread",
}
COLUMNS = ["kernel", "launches profiled", *METRICS.values(), "block", "grid"]
# A short run: the profiled window's launches (a step's forward and backward kernels);
# not compiled (Inductor's compiling and autotuning would run under ncu too).
RUN_ARGS = ["--wait", "1", "--warmup", "0", "--active", "2", "--no-compile"]
PERMISSION = "ERR_NVGPUCTRPERM"
POINT_CALLS = 3


class CountersRefused(ProjectError):
    exit_code = 1


def find_ncu() -> str:
    """ncu's path: on PATH, else where the CUDA toolkit puts it."""
    for candidate in (shutil.which("ncu"), "/usr/local/cuda/bin/ncu"):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    raise UserError("make ncu needs Nsight Compute's `ncu`, which is not on PATH nor in "
                    "/usr/local/cuda/bin: install the CUDA toolkit's nsight-compute")


def ncu_command(ncu: str, out: Path, target: list[str]) -> list[str]:
    return [ncu, "--target-processes", "all", "--kernel-name", KERNELS,
            "--metrics", ",".join(METRICS), "--csv", "--page", "raw",
            "--log-file", str(out / "ncu-raw.csv"), "--export", str(out / "report"),
            sys.executable, *target]


def training_run(out: Path, train_args: list[str]) -> list[str]:
    return ["train.py", *RUN_ARGS, "--out-dir", str(out), *train_args]


def parse_point(text: str) -> tuple[int, int, float]:
    """'B,M,SIGMA' (SIGMA a number or 'full') -> (batch, capacity, sigma)."""
    parts = text.split(",")
    try:
        batch, capacity = int(parts[0]), int(parts[1])
        sigma = math.inf if parts[2] == "full" else float(parts[2])
        if len(parts) != 3 or batch < 1 or capacity < 1 or not sigma > 0:
            raise ValueError
    except (ValueError, IndexError):
        raise UserError(f"--point takes BATCH,CAPACITY,SIGMA (whole numbers of at least 1, "
                        f"a sigma above 0 or 'full'), as 1024,1024,full; not {text!r}") from None
    return batch, capacity, sigma


def call_point(loss: str, backend: str, point: str, device: str = "cuda") -> None:
    """What ncu profiles for --point: the loss and its backward at the point, one call to
    warm up and POINT_CALLS more (the process ncu starts; a test's on the CPU)."""
    import torch

    import losses
    from studies.sweep_point import loss_call, predictions, samples
    batch, capacity, sigma = parse_point(point)
    strategy = losses.get(loss, backend, capacity=capacity)
    device = torch.device(device)
    _, host_targets = strategy.collate(samples(batch, capacity, sigma, seed=0))
    call = loss_call(strategy, predictions(batch, capacity, device, torch.bfloat16, 0),
                     strategy.to_device(host_targets, device))
    for _ in range(1 + POINT_CALLS):
        call()
    if device.type == "cuda":
        torch.cuda.synchronize()  # host-device sync: every call done before the process ends


def number(text: str) -> float | None:
    """ncu's printed value ('1,234.5') as a float, or None where it is not a number."""
    try:
        return float(text.replace(",", ""))
    except ValueError:
        return None


def short_name(name: str) -> str:
    """'void <unnamed>::giou_fwd_kernel<0, c10::BFloat16, ...>(...)' ->
    'giou_fwd_kernel<0, c10::BFloat16, ...>' (ncu names the anonymous namespace)."""
    name = name.removeprefix("void ")
    for namespace in ("<unnamed>::", "(anonymous namespace)::"):
        name = name.replace(namespace, "")
    return name.split("(")[0] if "(" in name else name


def read_raw(text: str) -> list[dict]:
    """ncu's --csv --page raw output: a header of metric names, a row of their units, one
    row a profiled launch; the ==PROF== lines ncu writes around them are not CSV. Each
    launch's dict carries the units under "_units"."""
    table = list(csv.reader(line for line in text.splitlines() if line.startswith('"')))
    if not table:
        return []
    header, body = table[0], table[1:]
    units = {}
    if body and not body[0][0].strip():  # the units row has no launch ID
        units, body = dict(zip(header, body[0])), body[1:]
    return [{**dict(zip(header, row)), "_units": units} for row in body]


def in_us(value: float, unit: str) -> float:
    """A duration in ncu's unit (ns, us, ms, their long names) in µs; an unknown unit as ns."""
    return value * {"ns": 1e-3, "nsecond": 1e-3, "usecond": 1.0, "us": 1.0,
                    "msecond": 1e3, "ms": 1e3}.get(unit.strip(), 1e-3)


def kernel_rows(launches: list[dict]) -> list[dict]:
    """One row a kernel: the mean of each metric over its profiled launches."""
    by_kernel = defaultdict(list)
    for launch in launches:
        by_kernel[short_name(launch["Kernel Name"])].append(launch)
    rows = []
    for name, group in by_kernel.items():
        row = {"kernel": name, "launches profiled": len(group),
               "block": group[0].get("Block Size"), "grid": group[0].get("Grid Size")}
        for metric, column in METRICS.items():
            values = [number(g.get(metric, "")) for g in group]
            values = [v for v in values if v is not None]
            if not values:
                row[column] = None
                continue
            mean = sum(values) / len(values)
            if metric == "gpu__time_duration.sum":
                mean = in_us(mean, group[0]["_units"].get(metric, "ns"))
            row[column] = mean
        rows.append(row)
    return sorted(rows, key=lambda r: -(r["duration us"] or 0))


def run_ncu(cmd: list[str], raw: Path) -> tuple[int, str]:
    """(exit code, everything it said: its output and the raw CSV it logged) of ncu's
    command line, printed first."""
    print(f"[ncu] {' '.join(cmd)}", flush=True)
    # ncu leaves a folder of its own (nvidia/) in the temporary folder: a private one,
    # removed after.
    scratch = tempfile.mkdtemp(prefix="ncu-")
    try:
        done = subprocess.run(cmd, capture_output=True, text=True,
                              env={**os.environ, "TMPDIR": scratch})
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return done.returncode, done.stdout + done.stderr + (raw.read_text() if raw.exists() else "")


def counters_refusal(output: str) -> str | None:
    """The one line for ncu refused the performance counters, or None."""
    if PERMISSION in output:
        return ("ncu may not read this GPU's performance counters (ERR_NVGPUCTRPERM): run "
                "it as root, or load the driver with NVreg_RestrictProfilingToAdminUsers=0")
    return None


def _parse(argv):
    parser = argparse.ArgumentParser(prog="make ncu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--loss", default="kernel", help="a fused strategy: "
                        + ", ".join(FUSED))
    parser.add_argument("--backend", default="triton", choices=BACKENDS)
    parser.add_argument("--out", type=Path, default=None,
                        help="the folder (default profiles/ncu-<strategy>-<UTC time>)")
    parser.add_argument("--point", default=None, help="BATCH,CAPACITY,SIGMA: the loss alone "
                        "at a sweep point (SIGMA a number or 'full'), not a training run")
    parser.add_argument("--call-point", default=None, help=argparse.SUPPRESS)  # ncu's child
    return parser.parse_known_args(argv)


def _main(argv) -> int:
    args, train_args = _parse(argv)
    if args.call_point:
        call_point(args.loss, args.backend, args.call_point)
        return 0
    if args.loss not in FUSED:
        raise UserError(f"make ncu profiles the fused loss kernels: LOSS={args.loss} has "
                        f"none; choose one of {', '.join(FUSED)}")
    if args.point:
        parse_point(args.point)  # refused here, before ncu starts
        if train_args:
            raise UserError(f"--point runs the loss alone: train.py's options "
                            f"({' '.join(train_args)}) do not apply")
    import torch
    if not torch.cuda.is_available():
        raise UserError("make ncu needs a GPU: Nsight Compute profiles CUDA kernels")
    ncu = find_ncu()
    name = folder_name(args.loss, args.backend)
    out = fresh_out(args.out, "ncu", f"ncu-{name}")  # never another table's folder
    chosen = ["--loss", args.loss, "--backend", args.backend]
    target = (["-m", "studies.ncu", *chosen, "--call-point", args.point] if args.point
              else training_run(out, [*chosen, *train_args]))
    cmd = ncu_command(ncu, out, target)
    raw = out / "ncu-raw.csv"
    code, output = run_ncu(cmd, raw)
    if refusal := counters_refusal(output):
        raise CountersRefused(refusal)
    if code:
        tail = "; ".join(line for line in output.splitlines()[-3:] if line.strip())
        raise ProjectError(f"the run under ncu failed (exit {code}): {tail}")
    rows = kernel_rows(read_raw(raw.read_text())) if raw.exists() else []
    if not rows:
        raise UserError(f"ncu profiled no kernel matching {KERNELS} in that run")
    table = markdown_of_dicts(COLUMNS, rows, left={"kernel", "block", "grid"})
    what = (f"{name}, the loss alone at batch, capacity, sigma {args.point}" if args.point
            else f"{name}, a training run")
    write_whole(out / "ncu.md", f"{what}: the loss kernels under Nsight Compute, the mean "
                f"of each kernel's profiled launches\n\n{table}\n")
    write_whole(out / "ncu.csv", csv_text(COLUMNS, rows))
    print(table)
    print(f"written: {display(out / 'ncu.md')}, ncu.csv and report.ncu-rep")
    return 0


main = command(_main)

if __name__ == "__main__":
    run_command(main, "the ncu table was not written")
