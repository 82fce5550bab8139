"""The case study's training loop under torch.profiler, one loss strategy per run.

    python3 train.py --loss padded                 # full step: copy, forward, loss, backward, optimizer
    python3 train.py --loss loop --mode forward    # the original's measurement
    python3 train.py --help                        # every knob, generated from Config

Each run writes profiles/<run>/: a gzip Chrome trace (TensorBoard's profiler plugin reads
it), TensorBoard scalars, and summary.json with the step-time table, the full config and
the environment. Every number in the table comes from that run's trace.
"""

import argparse
import dataclasses
import gc
import json
import os
import platform
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch

from errors import UserError, one_line

REPO = Path(__file__).resolve().parent


@dataclass
class Config:
    """The single source of defaults: the GPU preset is the workload's full size."""
    loss: str = "padded"         # loop | concat | padded | compiled | kernel | conditional
    kernel: str = "triton"       # fused-kernel backend for kernel/conditional: triton | cuda
    mode: str = "train"          # train: full step; forward: the original's measurement
                                 #   (forward + loss only, a device sync closing each range)
    preset: str = "auto"         # auto: gpu on a CUDA machine, cpu otherwise
    batch_size: int = 1024
    num_workers: int = 16
    main_cores: int = 0          # >0: the training process keeps this many CPU cores to
                                 #   itself and the data workers run on the others
    image_size: int = 256        # square grayscale images, a multiple of 16, at most 256
    max_boxes: int = 256         # the model's box capacity (prediction slots per image)
    hidden: int = 16384          # width of lin1 (1.07 B parameters at the full size)
    wait: int = 1                # profiler schedule: skipped steps (compile happens here)
    warmup: int = 2              # traced but discarded steps
    active: int = 5              # profiled steps: the table's means are over these
    compile: bool = True         # torch.compile the model
    amp: bool = True             # bf16 autocast for the forward (CUDA only)
    pin_memory: bool = True
    lr: float = 1e-4             # SGD with momentum 0.9
    seed: int = 0                # same seed, same batches for every strategy
    dataset_length: int = 1_000_000
    out_dir: str = "profiles"
    run_name: str = ""           # default: <loss>[-<kernel>]-<mode>-<UTC time>


# A preset overrides some defaults; options given on the command line override the preset.
PRESETS = {
    "gpu": {},
    # Finishes in about a minute on 2 CPU cores.
    "cpu": dict(batch_size=32, num_workers=2, image_size=64, hidden=512, wait=1, warmup=1,
                active=3, compile=False, amp=False, pin_memory=False),
}
MODES = ("train", "forward")


def parse_config(argv=None) -> Config:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    for f in dataclasses.fields(Config):
        flag = "--" + f.name.replace("_", "-")
        if f.type is bool or f.type == "bool":
            parser.add_argument(flag, action=argparse.BooleanOptionalAction,
                                default=argparse.SUPPRESS, help=f"(default {f.default})")
        else:
            parser.add_argument(flag, type=type(f.default), default=argparse.SUPPRESS,
                                help=f"(default {f.default})")
    given = vars(parser.parse_args(argv))
    preset = given.get("preset", Config.preset)
    if preset == "auto":
        preset = "gpu" if torch.cuda.is_available() else "cpu"
    if preset not in PRESETS:
        raise UserError(f"unknown preset {preset!r}: choose auto, gpu or cpu")
    if preset == "gpu" and not torch.cuda.is_available():
        raise UserError("the gpu preset needs a CUDA GPU; use --preset cpu (the default "
                        "without a GPU)")
    return Config(**{**PRESETS[preset], **given, "preset": preset})


def validate(cfg: Config) -> None:
    """Every mistake found before anything is written."""
    if cfg.mode not in MODES:
        raise UserError(f"unknown mode {cfg.mode!r}: choose train or forward")
    if cfg.image_size % 16 or not 16 <= cfg.image_size <= 256:
        raise UserError(f"image size {cfg.image_size} must be a multiple of 16 in 16..256")
    for name in ("batch_size", "max_boxes", "hidden", "active"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    if cfg.wait < 0 or cfg.warmup < 0 or cfg.num_workers < 0:
        raise UserError("--wait, --warmup and --num-workers must not be negative")


def environment() -> dict:
    def git(*args):
        try:
            done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True,
                                  timeout=10)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    cuda = torch.cuda.is_available()
    # GIT_COMMIT, where set, names the commit of a copied tree: the device machine's copy
    # carries a stale .git, whose HEAD and status say nothing about the tree.
    copied = os.environ.get("GIT_COMMIT")
    status = None if copied else git("status", "--porcelain", "--untracked-files=no")
    return {
        "device": torch.cuda.get_device_name() if cuda else platform.processor() or "cpu",
        "torch": torch.__version__,
        "triton": triton_version,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "commit": copied or git("rev-parse", "HEAD"),
        "dirty": None if status is None else bool(status),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


def new_run_dir(cfg: Config, label: str) -> Path:
    """A fresh folder: a run never overwrites another."""
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    name = cfg.run_name or f"{label.replace('/', '-')}-{cfg.mode}-{stamp}"
    base = REPO / cfg.out_dir if not Path(cfg.out_dir).is_absolute() else Path(cfg.out_dir)
    for suffix in [""] + [f"-{i}" for i in range(2, 1000)]:
        path = base / (name + suffix)
        try:
            path.mkdir(parents=True, exist_ok=False)
            return path
        except FileExistsError:
            continue
    raise UserError(f"could not find a free run folder name under {base}")


def phases_of(mode: str) -> tuple[str, ...]:
    base = ("data", "copy", "forward", "loss")
    return base + (("loss_backward", "backward", "optimizer") if mode == "train" else ())


def _lower_worker_priority(_worker_id: int) -> None:
    """Data workers yield the CPU to the training process. Measured on the 16-core H100
    host: with 16 busy workers the main thread was preempted inside the timed ranges (a
    fused loss of 10 us of GPU work read 1.5-14 ms of CPU time, step times swung 48-105
    ms). Generation throughput is unchanged; only who waits changes."""
    os.nice(19)


# The cores this process started with: a run with --main-cores narrows the main thread's,
# and the next run of the same process (make compare) splits, or gets back, these.
_START_CORES = frozenset(os.sched_getaffinity(0))


def split_cores(main_cores: int) -> tuple[set[int], set[int]] | None:
    """(cores of the training process, cores of the data workers), or None for no split."""
    cores = sorted(_START_CORES)
    if main_cores <= 0:
        return None
    if main_cores >= len(cores):
        raise UserError(f"--main-cores {main_cores} leaves no core for the data workers: "
                        f"this process may use {len(cores)}")
    return set(cores[:main_cores]), set(cores[main_cores:])


def _worker_init(worker_cores: set[int] | None):
    def init(worker_id: int) -> None:
        _lower_worker_priority(worker_id)
        if worker_cores:
            os.sched_setaffinity(0, worker_cores)
    return init


# One model kept between the runs of a process (make compare): its config key, the model,
# what runs it (compiled or not), and its initial parameters on the host.
_kept: dict = {}


def build_model(cfg: Config, device: torch.device, reuse: bool):
    """(model, runner) initialised from cfg.seed; runner is torch.compile(model) or model.

    Built on the device: initialising the 1.07 B parameters of the full model on the host
    took 15 s on 2 cores (then a 4.3 GB copy), every run. With reuse, a later run with the
    same shape and seed gets the same model back with its initial parameters restored from
    pinned host memory (4.3 GB, ~0.2 s), so torch.compile's work (its guards hold for the
    same module) and CUDA's start-up are paid once per process. The host copy keeps the
    GPU's peak memory what a fresh process would see."""
    from model import BoxNet
    key = (cfg.image_size, cfg.max_boxes, cfg.hidden, cfg.compile, cfg.seed, str(device))
    torch.manual_seed(cfg.seed)
    if reuse and _kept.get("key") == key:
        model = _kept["model"]
        with torch.no_grad():
            for p, p0 in zip(model.parameters(), _kept["initial"]):
                p.copy_(p0, non_blocking=True)
                p.grad = None
        return model, _kept["runner"]
    _kept.clear()
    with device:
        model = BoxNet(cfg.image_size, cfg.max_boxes, cfg.hidden)
    runner = torch.compile(model) if cfg.compile else model
    if reuse:
        pin = device.type == "cuda"
        initial = [p.detach().to("cpu", copy=True).pin_memory() if pin else
                   p.detach().clone() for p in model.parameters()]
        _kept.update(key=key, model=model, runner=runner, initial=initial)
    return model, runner


def make_profiler(cfg: Config, run_dir: Path, cuda: bool) -> torch.profiler.profile:
    """wait/warmup/active schedule; a gzip Chrome trace into the run folder at the end."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    return torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active,
                                         repeat=1),
        # Plain JSON here, gzipped by gzip_traces afterwards: see profiling/trace_writer.py.
        on_trace_ready=torch.profiler.tensorboard_trace_handler(str(run_dir), "train"),
        record_shapes=False, profile_memory=True, with_stack=False)


def run(cfg: Config, reuse: bool = False) -> dict:
    """One profiled run. reuse=True (make compare, many runs in one process) keeps the
    model and its compiled form for the next run: see build_model."""
    from data import SyntheticFaces
    import losses
    from profiling.table import format_table
    from profiling.trace_summary import find_trace, load_trace, summarize
    from profiling.trace_writer import gzip_traces

    validate(cfg)
    strategy = losses.get(cfg.loss, kernel=cfg.kernel, capacity=cfg.max_boxes)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    if strategy.needs_cuda and not cuda:
        raise UserError(f"--kernel {cfg.kernel} needs a CUDA GPU; use --kernel triton")
    dataset = SyntheticFaces(cfg.dataset_length, cfg.image_size, cfg.seed)
    cores = split_cores(cfg.main_cores)
    worker_cores = cores[1] if cores else None
    # Set before the loader starts: its threads inherit the main thread's cores, and each
    # forked worker then moves itself to the workers' cores.
    os.sched_setaffinity(0, cores[0] if cores else _START_CORES)
    steps = cfg.wait + cfg.warmup + cfg.active
    if steps * cfg.batch_size > len(dataset):
        raise UserError(f"{steps} steps of {cfg.batch_size} need more than the "
                        f"{len(dataset)} samples of --dataset-length")
    loader = torch.utils.data.DataLoader(
        dataset, batch_size=cfg.batch_size, shuffle=False, drop_last=True,
        num_workers=cfg.num_workers, collate_fn=strategy.collate,
        pin_memory=cuda and cfg.pin_memory, worker_init_fn=_worker_init(worker_cores))
    if cuda:
        # Earlier runs of this process (make compare) leave cached blocks; each run's peak
        # memory is its own.
        gc.collect()
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()
    t_model = time.perf_counter()
    model, runner = build_model(cfg, device, reuse)
    params = sum(p.numel() for p in model.parameters())
    t_model = time.perf_counter() - t_model
    optimizer = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=0.9)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.amp and cuda)
    forward_only = cfg.mode == "forward"
    one = torch.ones((), device=device)  # d loss / d loss, made once: no fill launch per step

    def close_range():
        # The original's method: a device sync closes each range, so the range's CPU time
        # covers its GPU work. Forward mode only; train mode has no sync inside a phase.
        if forward_only and cuda:
            torch.cuda.synchronize()  # host-device sync (forward mode, by design)

    label = losses.describe(cfg.loss, cfg.kernel)
    run_dir = new_run_dir(cfg, label)
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter(str(run_dir))
    profiler = make_profiler(cfg, run_dir, cuda)
    print(f"[{label}] {cfg.mode} mode, {cfg.preset} preset, batch {cfg.batch_size}, "
          f"{steps} steps ({cfg.wait} wait, {cfg.warmup} warmup, {cfg.active} profiled) "
          f"on {device} -> {run_dir.relative_to(REPO) if run_dir.is_relative_to(REPO) else run_dir}"
          f"; model of {params / 1e6:.1f} M parameters built in {t_model:.1f} s", flush=True)
    losses_seen = []
    batches = iter(loader)
    with profiler:
        for step in range(steps):
            t0 = time.perf_counter()
            with torch.profiler.record_function("data"):
                images, targets = next(batches)
            with torch.profiler.record_function("copy"):
                images = images.to(device, non_blocking=True)
                targets = strategy.to_device(targets, device)
                close_range()
            with torch.profiler.record_function("forward"):
                with autocast:
                    pred = runner(images)
                close_range()
            with torch.profiler.record_function("loss"):
                loss = strategy.loss(pred, targets)
                close_range()
            if not forward_only:
                # The backward in two ranges, so the loss's own backward shows apart from
                # the model's: the same work as loss.backward(), in two engine calls.
                with torch.profiler.record_function("loss_backward"):
                    (grad_pred,) = torch.autograd.grad(loss, pred, grad_outputs=one)
                with torch.profiler.record_function("backward"):
                    pred.backward(grad_pred)
                with torch.profiler.record_function("optimizer"):
                    optimizer.step()
                    optimizer.zero_grad(set_to_none=True)
            # host-device sync: once per step, outside the phases. It makes the step's wall
            # time its real time and keeps the host from running ahead of the GPU.
            value = loss.item()
            # Release this step's tensors here, outside every phase. Kept, they would be
            # freed by the next step's assignments, inside its ranges: in forward mode
            # `loss` holds, through the predictions, the autograd graph the forward
            # recorded (the compiled model's saved activations), so the next `loss = ...`
            # tore that graph down inside the loss range (RESULTS.md section 3 has the
            # before and after).
            del images, targets, pred, loss
            if not forward_only:
                del grad_pred
            elapsed_ms = (time.perf_counter() - t0) * 1e3
            losses_seen.append(value)
            writer.add_scalar("loss", value, step)
            writer.add_scalar("step_time_ms", elapsed_ms, step)
            phase = ("wait" if step < cfg.wait else
                     "warmup" if step < cfg.wait + cfg.warmup else "profiled")
            print(f"[{label}] step {step + 1}/{steps} ({phase}) loss {value:.4f} "
                  f"{elapsed_ms:.1f} ms", flush=True)
            profiler.step()
        print(f"[{label}] writing the trace...", flush=True)
    peak_gb = torch.cuda.max_memory_allocated() / 1e9 if cuda else None

    t0 = time.perf_counter()
    gzip_traces(run_dir)
    trace = find_trace(run_dir)
    summary = summarize(load_trace(trace), phases_of(cfg.mode))
    print(f"[{label}] trace {trace.name} ({trace.stat().st_size / 1e6:.1f} MB) gzipped and "
          f"summarized in {time.perf_counter() - t0:.1f} s", flush=True)
    for name, p in summary["phases"].items():
        writer.add_scalar(f"phase_cpu_ms/{name}", p["cpu_ms"], 0)
        writer.add_scalar(f"phase_gpu_ms/{name}", p["gpu_ms"], 0)
    writer.close()
    env = environment()
    title = f"{label}, {cfg.mode} mode, batch {cfg.batch_size}, {env['device']}"
    table = format_table(summary, title, on_gpu=cuda)
    record = {"config": dataclasses.asdict(cfg), "environment": env,
              "trace": trace.name, "table": table, "losses": losses_seen,
              "peak_gpu_memory_gb": peak_gb, **summary}
    (run_dir / "summary.json").write_text(json.dumps(record, indent=2) + "\n")
    record["run_dir"] = str(run_dir)
    print(table)
    print(f"written: {run_dir / 'summary.json'}")
    return record


def main(argv=None) -> int:
    try:
        run(parse_config(argv))
    except UserError as exc:
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
