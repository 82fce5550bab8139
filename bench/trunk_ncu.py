"""What bounds each of the trunk's kernels, by Nsight Compute.

One compiled trunk call (forward and backward, as the step builds it) under ncu, a row a
kernel: its time at ncu's clocks, SM and DRAM throughput, the tensor pipe, the busiest
other pipe, registers, warps active against the most that fit, and the three reasons that
stall its warps most. ncu locks the clocks and replays each kernel: the times are not the
step's (bench/trunk_kernels.py gives those); the shares say what each kernel waits on.

Run on the device: python3 bench/trunk_ncu.py [--loss kernel] [--out DIR] [-- --backend cuda]
"""

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, ".")
from bench.needs_gpu import require_cuda  # noqa: E402
from studies.ncu import counters_refusal, find_ncu, in_us, number, read_raw, run_ncu, short_name  # noqa: E402

# The trunk's Triton blocks and cuDNN's convolutions (the fourth block's).
KERNELS = "regex:_first_block|_second_block|_conv_pool|_pool_|xmma|cudnn"
SECTIONS = ("SpeedOfLight", "Occupancy", "LaunchStats", "WarpStateStats",
            "ComputeWorkloadAnalysis")
PIPES = ("adu", "alu", "cbu", "fma", "fp64", "lsu", "tex", "tma", "uniform", "xu")
STALL = ("smsp__average_warps_issue_stalled_", "_per_issue_active.ratio")
SHARE = ".avg.pct_of_peak_sustained_active"


def one_call(loss: str, train_args: list[str]) -> None:
    """ncu's child: the trunk compiled and warmed up outside the profiled range, then one
    call inside it (cudaProfilerStart/Stop; ncu runs with --profile-from-start off)."""
    import torch

    from bench.roofline import preset_step, trunk_call
    _, model, _, batch = preset_step(["--loss", loss, *train_args])
    trunk = trunk_call(model, batch[0])
    for _ in range(3):
        trunk()
    torch.cuda.synchronize()  # host-device sync: the warm-up ends before the range opens
    torch.cuda.profiler.start()
    trunk()
    torch.cuda.synchronize()  # host-device sync: the profiled call ends inside the range
    torch.cuda.profiler.stop()


def _number(launch: dict, metric: str) -> float:
    """A launch's metric (studies/ncu.number), NaN where ncu printed none."""
    value = number(launch.get(metric, ""))
    return float("nan") if value is None else value


def kernel_label(name: str) -> str:
    """'sm90_xmma_dgrad_implicit_gemm_...' -> 'cuDNN dgrad'; a Triton kernel's own name."""
    name = short_name(name)
    if name.startswith("sm90_xmma_"):
        return f"cuDNN {name.split('_')[2]}"
    return f"`{name.removesuffix('_kernel')}`"


def row(launch: dict) -> str:
    """One launch's markdown row (the columns of table())."""
    shares = {p: _number(launch, f"sm__inst_executed_pipe_{p}{SHARE}") for p in PIPES}
    busiest = max(PIPES, key=lambda p: shares[p] if shares[p] >= 0 else -1)  # NaN last
    stalls = sorted(((_number(launch, name), name.removeprefix(STALL[0]).removesuffix(STALL[1]))
                     for name in launch if name.startswith(STALL[0]) and name.endswith(STALL[1])
                     and name != f"{STALL[0]}selected{STALL[1]}"), reverse=True)[:3]
    us = in_us(_number(launch, "gpu__time_duration.sum"),
               launch["_units"].get("gpu__time_duration.sum", "ns"))
    cells = [kernel_label(launch["Kernel Name"]), f"{us:.0f}",
             f"{_number(launch, 'sm__throughput.avg.pct_of_peak_sustained_elapsed'):.0f}",
             f"{_number(launch, 'gpu__dram_throughput.avg.pct_of_peak_sustained_elapsed'):.0f}",
             f"{_number(launch, 'sm__pipe_tensor_cycles_active' + SHARE):.0f}",
             f"{busiest} {shares[busiest]:.0f}",
             f"{_number(launch, 'launch__registers_per_thread'):.0f}",
             f"{_number(launch, 'sm__warps_active' + SHARE):.0f} / "
             f"{_number(launch, 'sm__maximum_warps_per_active_cycle_pct'):.0f}",
             ", ".join(f"{name} {value:.1f}" for value, name in stalls)]
    return "| " + " | ".join(cells) + " |"


def table(launches: list[dict]) -> str:
    """Markdown, a row a profiled launch in the order they ran."""
    return "\n".join([
        "| kernel | µs (ncu) | SM % | DRAM % | tensor pipe % | busiest other pipe % | "
        "registers | warps active / most that fit, % | stalls (warps an issue), top three |",
        "|---|---:|---:|---:|---:|---|---:|---|---|", *map(row, launches)])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loss", default="kernel")
    ap.add_argument("--out", type=Path, default=None,
                    help="ncu's report and raw CSV (default profiles/trunk-ncu-<UTC time>)")
    ap.add_argument("--one-call", action="store_true", help=argparse.SUPPRESS)  # ncu's child
    ap.add_argument("train_args", nargs="*", help="more train.py options, after --")
    args = ap.parse_args()
    require_cuda("Nsight Compute profiles the trunk's kernels on the device")
    if args.one_call:
        one_call(args.loss, args.train_args)
        return
    ncu = find_ncu()
    out = args.out or Path("profiles") / time.strftime("trunk-ncu-%Y%m%d-%H%M%S", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)
    cmd = [ncu, "--profile-from-start", "off", "--kernel-name", KERNELS,
           *(a for s in SECTIONS for a in ("--section", s)), "--csv", "--page", "raw",
           "--log-file", str(out / "raw.csv"), "--export", str(out / "report"), "--force-overwrite",
           sys.executable, __file__, "--one-call", "--loss", args.loss, "--", *args.train_args]
    raw = out / "raw.csv"
    code, output = run_ncu(cmd, raw)
    if refusal := counters_refusal(output):
        sys.exit(f"error: {refusal}")
    launches = read_raw(raw.read_text()) if raw.exists() else []
    if code or not launches:
        tail = "; ".join(line for line in output.splitlines()[-3:] if line.strip())
        sys.exit(f"error: ncu profiled nothing (exit {code}): {tail}")
    import torch
    print(f"# The trunk's kernels under Nsight Compute, {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}, {args.loss}\n\n{table(launches)}\n\nwritten: {raw}, "
          f"{out / 'report.ncu-rep'}")


if __name__ == "__main__":
    main()
