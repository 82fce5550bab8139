"""The case study's training loop under torch.profiler, one loss strategy per run.

    python3 train.py --loss padded                 # copy, forward, loss, backward, optimizer
    python3 train.py --loss loop --mode forward    # the original's measurement
    python3 train.py --help                        # every knob, generated from Config

Each run writes <out-dir>/<run>/: a gzip Chrome trace (TensorBoard's profiler plugin reads
it), TensorBoard scalars, and summary.json with the step-time table, the full config and
the environment. Every number in the table comes from that run's trace. What happens
around the loop (run folder, profiler, summary, early ends) is profiling/harness.py's.
"""

# Before the imports below; only as the program: tests and studies import this module.
if __name__ == "__main__":
    from core.commands import program_starts
    program_starts()


import dataclasses
import math
import sys
import time
from dataclasses import dataclass

from core.cli import config_parser, option
from core.commands import leave
from core.errors import (
    ProjectError,
    UserError,
    exit_code,
    interruption,
    one_line,
)
from core.gc_pause import imports_done, paused
from core.names import BACKENDS, FUSED, MODES, STRATEGIES, describe, phases_of
from core.output import survive_closed_stdout
from core.phases import mark_nvtx, phase, step_range
from core.run_folder import check_out_dir, check_run_name, display, utc_stamp
from core.signals import (
    ignore_stop_signals,
    note_stop_signals,
    raise_if_stopped,
    stop_once,
    wrapped_interrupt,
)
from profiling.scaling import check_baseline
from training import ddp, parallel, speedups
from training.ddp import COMM_HOOKS
from training.ddp import HELP as DDP_HELP
from training.ranks import HANG_TIMEOUT_S, from_env, per_host, stop

try:
    import torch
except ImportError:  # --help works without torch; a run says how to get it
    torch = None


@dataclass
@speedups.switches
class Config:
    """The single source of defaults: the GPU preset is the workload's full size."""
    loss: str = option("padded", "loss strategy", choices=STRATEGIES)
    backend: str = option("triton", "kernel backend of the fused strategies (kernel, "
                          "conditional, packed)", choices=BACKENDS, aliases=("--kernel",))
    mode: str = option("train", "train: the full step; forward: the original's measurement "
                       "(forward and loss only, a device sync closing each range)",
                       choices=MODES)
    preset: str = option("auto", "auto: gpu on a CUDA machine, cpu otherwise",
                         choices=("auto", "gpu", "cpu"))
    batch_size: int = option(1024, "samples per step")
    num_workers: int = option(16, "data loader processes")
    main_cores: int = option(0, ">0: the training process keeps this many CPU cores to "
                             "itself and the data workers run on the others (Linux)")
    rank_cores: bool = option(True, "several ranks on one host: each rank, its data "
                              "workers too, keeps to its own share of the host's cores "
                              "(Linux; --main-cores then splits that share)")
    image_size: int = option(256, "square grayscale images, a multiple of 16 in 16..256")
    max_boxes: int = option(256, "the model's box capacity (prediction slots per image)")
    hidden: int = option(16384, "width of lin1 (1.07 B parameters at the full size)")
    wait: int = option(2, "profiler schedule: skipped steps (compile, cuDNN tuning and a "
                       "CUDA graph's capture happen here)")
    warmup: int = option(2, "profiler schedule: traced but discarded steps")
    active: int = option(5, "profiler schedule: profiled steps, the table's means")
    steps: int = option(0, "steps in the run (0: wait + warmup + active); those after the "
                        "profiled window run unprofiled, and the sustained rate counts them")
    seconds: float = option(0.0, "end the run after this many seconds of steps, once the "
                            "profiled window is done (0: no limit)")
    settle: int = option(2, "first steps left out of the sustained rate (compile, cuDNN "
                         "tuning; with a CUDA graph, every --wait step)")
    compile: bool = option(True, "torch.compile the model")
    torch_trace: str = option("", "a folder for torch.compile's structured log, what tlparse "
                              "reads (graphs, guards, recompiles); '' for none")
    memory_snapshot: bool = option(False, "where the GPU memory of the profiled steps goes: "
                                   "the allocator's snapshot (memory_snapshot.pickle), the "
                                   "profiler's memory by category (memory.html, the footer); "
                                   "records shapes and stacks, so host times grow (one "
                                   "process, CUDA only)")
    nvtx: bool = option(False, "each step and each of its phases also an NVTX range of the "
                        "same name, for Nsight Systems and Nsight Compute (CUDA only; "
                        "docs/runs.md)")
    amp: bool = option(True, "bf16 autocast for the forward (CUDA only)")
    pin_memory: bool = option(True, "pinned host memory for the batches (CUDA only)")
    loader: str = option("ring", "ring: the workers write each batch's images into a ring "
                         "of pinned shared buffers (data/ring_loader.py); torch: PyTorch's "
                         "DataLoader as the original used it; the same batches either way",
                         choices=("torch", "ring"))
    copy_ahead: bool = option(True, "train mode on a GPU without a CUDA graph: batch k+1's "
                              "H2D copies on a side stream while the GPU runs step k "
                              "(training/feed.py)")
    run_ahead: int = option(2, "train mode on a GPU: steps the host may enqueue ahead of the "
                            "GPU, each step's loss read that many steps late; room for a "
                            "late batch or launch before the GPU idles (profiling/"
                            "step_reader.py)")
    lr: float = option(1e-4, "SGD learning rate (momentum 0.9)")
    # The step's speed-ups (training/speedups/): a field each, added after this one in the
    # ladder's order by @speedups.switches, from each one's module; all off with --baseline.
    baseline: bool = option(False, "every speed-up off, as the original ran the step (a "
                            "speed-up given as well stays on)")
    # Several GPUs (make profile GPUS=N starts this script on N ranks; training/ddp.py):
    # --batch-size stays per rank, so the global batch is N times it.
    # Defaults: the fastest measured (results/several-gpus.md).
    bucket_mb: float = option(25.0, DDP_HELP["bucket_mb"])
    bucket_view: bool = option(True, DDP_HELP["bucket_view"])
    comm_hook: str = option("sum", DDP_HELP["comm_hook"], choices=COMM_HOOKS)
    overlap: bool = option(True, DDP_HELP["overlap"])
    parallel: str = option("auto", parallel.HELP, choices=parallel.CHOICES)
    hang_timeout: float = option(HANG_TIMEOUT_S, "several ranks: seconds a rank waits for "
                                 "the others as the group starts (20 at least) and in a "
                                 "collective once the first --settle steps are done "
                                 "(compiling is not a hang), before the job ends naming the "
                                 "rank that stopped answering")
    scaling_baseline: str = option("", "a one-GPU run folder of the same batch size per GPU: "
                                   "summary.json gives this run's scaling against it")
    seed: int = option(0, "same seed, same batches and weights for every strategy")
    dataset_length: int = option(1_000_000, "samples in the synthetic dataset")
    out_dir: str = option("profiles", "folder of the run folders, relative to the current "
                          "folder")
    run_name: str = option("", "the run folder's name (default <loss>[-<backend>]-<mode>-"
                           "<UTC time>)")


# A preset overrides some defaults; options given on the command line override the preset.
PRESETS = {
    "gpu": {},
    # Runs in seconds on 2 CPU cores (make profile: the README's figure).
    "cpu": dict(batch_size=32, num_workers=2, image_size=64, hidden=512, wait=1, warmup=1,
                active=3, compile=False, amp=False, pin_memory=False,
                # Its ranks share two cores in CI; --rank-cores paid on a GPU host whose
                # 64 loader workers crowded the ranks' main threads (results/several-gpus.md).
                rank_cores=False, **speedups.cpu_preset_values()),
}


# The flags make profile sets from its variables (Makefile): errors name both.
MAKE_VARIABLES = {"--loss": "LOSS", "--backend": "BACKEND", "--kernel": "BACKEND",
                  "--mode": "MODE"}


def given_options(argv=None) -> dict:
    """The options given on the command line, by Config field (a UsageError for a flag
    the parser refuses): what make compare and make ladder check before making their
    runs' configs from them."""
    return vars(config_parser(Config, PRESETS, __doc__.split("\n\n")[0],
                              MAKE_VARIABLES).parse_args(argv))


def parse_config(argv=None) -> Config:
    return make_config(given_options(argv))


def make_config(given: dict) -> Config:
    """The Config of these given options: the dataclass's defaults, the preset's, the
    baseline's, then each option given."""
    if torch is None:
        raise UserError(f"torch is not installed for {sys.executable}: run `make profile` "
                        "(its first run installs the requirements into .venv/), or `make "
                        "setup` for the install alone, then .venv/bin/python")
    preset = given.get("preset", Config.preset)
    if preset == "auto":
        preset = "gpu" if torch.cuda.is_available() else "cpu"
    if preset == "gpu" and not torch.cuda.is_available():
        raise UserError("the gpu preset needs a CUDA GPU; use --preset cpu (the default "
                        "without a GPU)")
    off = speedups.baseline_values() if given.get("baseline") else {}
    return Config(**{**PRESETS[preset], **off, **given, "preset": preset})


def validate(cfg: Config, world: int = 1) -> None:
    """Every mistake that can be found before anything is written (world: the ranks of a
    torchrun job, each reading --batch-size samples a step)."""
    # The command line refuses these already; a Config made in Python is checked here.
    for name, allowed in (("loss", STRATEGIES), ("backend", BACKENDS), ("mode", MODES)):
        if getattr(cfg, name) not in allowed:
            raise UserError(f"unknown --{name} {getattr(cfg, name)!r}: choose one of "
                            f"{', '.join(allowed)} (make's {MAKE_VARIABLES['--' + name]}=)")
    if cfg.image_size % 16 or not 16 <= cfg.image_size <= 256:
        raise UserError(f"image size {cfg.image_size} must be a multiple of 16 in 16..256")
    for name in ("batch_size", "max_boxes", "hidden", "active", "dataset_length"):
        if getattr(cfg, name) < 1:
            raise UserError(f"--{name.replace('_', '-')} must be at least 1")
    for name in ("wait", "warmup", "num_workers", "main_cores", "seed", "steps", "settle"):
        if getattr(cfg, name) < 0:
            raise UserError(f"--{name.replace('_', '-')} must not be negative")
    if cfg.run_ahead < 1:
        raise UserError(f"--run-ahead {cfg.run_ahead}: the host runs at least a step ahead "
                        "of the GPU (1 or more)")
    if not (math.isfinite(cfg.lr) and cfg.lr > 0):
        raise UserError(f"--lr must be a positive number, got {cfg.lr}")
    if not (math.isfinite(cfg.hang_timeout) and cfg.hang_timeout > 0):
        raise UserError(f"--hang-timeout must be a positive number of seconds, got "
                        f"{cfg.hang_timeout}")
    window = cfg.wait + cfg.warmup + cfg.active
    if cfg.steps and cfg.steps < window:
        raise UserError(f"--steps {cfg.steps} is shorter than the profiled window (--wait "
                        f"+ --warmup + --active = {window}): give at least {window}, or 0")
    if not (math.isfinite(cfg.seconds) and cfg.seconds >= 0):
        raise UserError(f"--seconds must be a number of seconds, 0 or more, got {cfg.seconds}")
    if cfg.seconds and cfg.steps <= window:
        raise UserError(f"--seconds ends a run once its profiled window is done, and this "
                        f"run is that window alone ({window} steps): give --steps too, "
                        "more than the window")
    steps = max(cfg.steps, window)
    if cfg.settle >= steps:
        raise UserError(f"--settle {cfg.settle} leaves none of the run's {steps} steps for "
                        "the sustained rate: give a smaller --settle or more --steps")
    if steps * cfg.batch_size * world > cfg.dataset_length:
        ranks = f" on each of {world} ranks" if world > 1 else ""
        raise UserError(f"{steps} steps of {cfg.batch_size}{ranks} need more than the "
                        f"{cfg.dataset_length} samples of --dataset-length")
    if cfg.backend == "cuda" and cfg.loss in FUSED:
        from kernels.giou.cuda_extension import unavailable_reason
        if unavailable_reason():
            raise UserError(f"{unavailable_reason()}: use the Triton backend (make: "
                            "BACKEND=triton; train.py: --backend triton)")
    if cfg.memory_snapshot and not torch.cuda.is_available():
        raise UserError("--memory-snapshot records the CUDA caching allocator: it needs a "
                        "CUDA GPU")
    if cfg.memory_snapshot and world > 1:
        raise UserError(f"--memory-snapshot records one process; this job has {world} "
                        "ranks: run it on one GPU")
    if cfg.run_name:
        check_run_name(cfg.run_name)
    check_out_dir(cfg.out_dir)
    speedups.check(asked_of(cfg), torch.cuda.is_available())
    spread = spread_of(cfg)
    ddp.check(spread)
    parallel.check(spread, world)
    if cfg.scaling_baseline:
        check_baseline(cfg.scaling_baseline, dataclasses.asdict(cfg))


@dataclass
class StepFns:
    """A step's work, as the profiler sees it. copy(host batch) -> device batch: the H2D
    copies (the 'copy' phase's work; training/feed.py may run them on a side stream a step
    ahead); arrive(device batch) -> device batch: what follows them on the compute stream;
    train_step(images, targets) -> loss: forward, loss, and in train mode loss_backward,
    backward, optimizer (no host sync in train mode, so a CUDA graph can hold it)."""
    copy: object
    arrive: object
    train_step: object

    def to_device(self, batch):
        """The batch copied and arrived: the copy phase of a step that copies in place."""
        return self.arrive(self.copy(batch))


def make_step(cfg: Config, strategy, runner, optimizer, device, across=None,
              prefetch=None, used=None) -> StepFns:
    """The step's functions (StepFns). across: on several ranks, the global batch's loss
    and gradients (training/distributed.GlobalBatch); the returned loss is the global
    batch's. prefetch: what starts before the forward, outside the compiled model
    (--parallel zero: lin1's all-gather, training/parallel.prefetcher). used: the
    speed-ups that are on, as the run resolved them (resolved here where not given)."""
    from training.distributed import GlobalBatch
    across = across or GlobalBatch(cfg.loss)
    cuda = device.type == "cuda"
    if used is None:
        used = speedups.resolve(asked_of(cfg), cuda)["on"]
    # The strategy's loss as the speed-ups that are on run it (--graphed-loss).
    loss_fn = speedups.wrap_loss(used, strategy.loss)
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=cfg.amp and cuda)
    forward_only = cfg.mode == "forward"
    one = torch.ones((), device=device)  # d loss / d loss, made once: no fill launch per step

    def close_range():
        # The original's method: a device sync closes each range, so the range's CPU time
        # covers its GPU work. Forward mode only; train mode has no sync inside a phase.
        if forward_only and cuda:
            torch.cuda.synchronize()  # host-device sync (forward mode, by design)

    def copy(batch):
        images, targets = batch
        return images.to(device, non_blocking=True), strategy.to_device(targets, device)

    def arrive(batch):
        across.count(batch[1], device)  # several ranks: their box counts, in the background
        close_range()
        return batch

    def train_step(images, targets):
        with phase("forward"):
            if prefetch is not None:
                prefetch()
            with autocast:
                pred = runner(images)
            close_range()
        with phase("loss"):
            # On several ranks: the mean over every rank's boxes, and what this rank
            # backpropagates so that the reduced gradient is the global batch's.
            loss = across.loss(loss_fn(pred, targets))
            close_range()
        if not forward_only:
            # The backward in two ranges, so the loss's own backward shows apart from
            # the model's: the same work as loss.backward(), in two engine calls.
            with phase("loss_backward"):
                (grad_pred,) = torch.autograd.grad(loss, pred, grad_outputs=one)
            with phase("backward"):
                pred.backward(grad_pred)
                across.after_backward()  # --no-overlap: the all-reduces, after it
            with phase("optimizer"):
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)
        # In forward mode the loss holds the forward's autograd graph through pred until
        # the caller drops it (outside every phase).
        return across.shown(loss)

    return StepFns(copy, arrive, train_step)


def run(cfg: Config, reuse: bool = False) -> dict:
    """One profiled run; returns its summary. reuse=True (make compare, many runs in one
    process) keeps the model and its compiled form for the next run (model/build.py)."""
    import losses
    from data import SyntheticFaces
    from data.loader import make_loader, own_rate
    from profiling import compile_account
    from profiling.harness import ProfiledRun
    from profiling.step_reader import StepReader, reader_lag
    from training.distributed import GlobalBatch, RankShare
    from training.feed import CopyAhead, InStep

    ranks = from_env()  # torchrun's rank and world; a world of one otherwise
    validate(cfg, ranks.world)
    # --parallel auto: which design this run uses
    design, why = parallel.choose(spread_of(cfg), ranks.world)
    cfg = dataclasses.replace(cfg, parallel=design)
    spread = spread_of(cfg)
    mark_nvtx(cfg.nvtx)
    strategy = losses.get(cfg.loss, backend=cfg.backend, capacity=cfg.max_boxes)
    cuda = torch.cuda.is_available()
    device = ranks.start(cuda, cfg.hang_timeout)  # its GPU (or the CPU), in the group
    asked = asked_of(cfg)
    speed = speedups.resolve(asked, cuda)
    used = speed["on"]
    speedups.set_process_flags(used, cuda, many_runs=reuse)
    loader = make_loader(SyntheticFaces(cfg.dataset_length, cfg.image_size, cfg.seed),
                         cfg.batch_size, cfg.num_workers, strategy.collate,
                         pin_memory=cuda and cfg.pin_memory, main_cores=cfg.main_cores,
                         sampler=RankShare.of(spread, ranks), ring=cfg.loader == "ring",
                         share=(ranks.local_rank, per_host()) if cfg.rank_cores else (0, 1))
    if cfg.torch_trace:
        compile_account.trace_to(cfg.torch_trace)
    t_model = time.perf_counter()
    with paused():  # the first optimizer imports torch._dynamo (core/gc_pause.py)
        model, runner, optimizer = speedups.build(used, device, reuse, model_sizes(cfg),
                                                  cfg.amp, cfg.lr,
                                                  *ddp.wrapper(spread, ranks, device))
    t_model = time.perf_counter() - t_model
    across = GlobalBatch.of(spread, ranks, model)
    fns = make_step(cfg, strategy, runner, optimizer, device, across,
                    parallel.prefetcher(spread, ranks, model), used)

    graphed = speedups.graphed_step(used, fns.train_step, fns.to_device, asked)
    # Forward mode keeps the original's copy, closed by a sync; a graph copies into its
    # captured tensors; a CPU has no stream to copy on.
    ahead = cfg.copy_ahead and cuda and cfg.mode == "train" and graphed is None
    feed = (CopyAhead if ahead else InStep)(loader, fns.copy, fns.arrive)
    batches = {"loader": cfg.loader,
               "copy": "a step ahead, on a side stream" if ahead else "in the step"}

    label = describe(cfg.loss, cfg.backend)
    name = cfg.run_name or f"{label.replace('/', '-')}-{cfg.mode}-{utc_stamp()}"
    with ProfiledRun(plan_of(cfg), label, phases_of(cfg.mode, graphed is not None), cuda,
                     check_out_dir(cfg.out_dir), name, used=speed, ranks=ranks,
                     facts={"batches": batches,
                            "parallel": {"design": design, "why": why}}) as prof:
        params = sum(p.numel() for p in model.parameters())
        where = (f"{ranks.world} ranks ({device.type}, --parallel {cfg.parallel})"
                 if ranks.distributed else device)
        prof.say(f"{cfg.mode} mode, {cfg.preset} preset, batch {cfg.batch_size}, {prof.total} "
                 f"steps ({cfg.wait} wait, {cfg.warmup} warmup, {cfg.active} profiled) "
                 f"on {where} -> {display(prof.dir)}; model of {params / 1e6:.1f} M "
                 f"parameters built in {t_model:.1f} s")
        prof.say(f"speed-ups: {speedups.describe_used(speed, ranks.world)}")
        if ranks.distributed:
            prof.say(f"design: --parallel {design} ({why})")
        prof.say(f"batches: {cfg.loader} loader, copied to the device {batches['copy']}")
        # The loss is read --run-ahead steps late in train mode on a GPU (reader_lag).
        reader = StepReader(cuda, lag=reader_lag(cfg.mode, cfg.run_ahead, cuda))
        try:
            _steps(prof, feed, graphed, fns.train_step, reader)
        finally:  # an early end's summary has it too
            batches["loader_rate"] = own_rate(loader)
            feed.close()
    return prof.record


def asked_of(cfg: Config):
    """What the speed-ups' checks read of the run (training/speedups/base.Asked): each
    one's value, a few of the run's fields, and the several-rank design it uses."""
    from training.speedups.base import Asked
    world = from_env().world
    return Asked(values={name: getattr(cfg, name) for name in speedups.ORDER},
                 loss=cfg.loss, mode=cfg.mode, amp=cfg.amp, wait=cfg.wait,
                 design=parallel.choose(spread_of(cfg), world)[0] if world > 1 else "ddp",
                 world=world)


def spread_of(cfg: Config):
    """What the several-rank code reads of the run (training/spread.py)."""
    from training.spread import Spread
    return Spread(**{f.name: getattr(cfg, f.name) for f in dataclasses.fields(Spread)})


def model_sizes(cfg: Config) -> tuple:
    """model/build.py's image_size, capacity, hidden, compile and seed, in that order."""
    return cfg.image_size, cfg.max_boxes, cfg.hidden, cfg.compile, cfg.seed


def plan_of(cfg: Config):
    """What the harness reads of the run (profiling/run_plan.py): the fields of its own
    name, the whole configuration for summary.json, whether a speed-up runs Triton
    kernels, and the several-rank knobs."""
    from profiling.run_plan import RunPlan
    given = {f.name for f in dataclasses.fields(RunPlan)} - {"config", "runs_triton", "ddp"}
    return RunPlan(config=dataclasses.asdict(cfg), runs_triton=speedups.runs_triton(asked_of(cfg)),
                   ddp=ddp.knobs(spread_of(cfg)), **{name: getattr(cfg, name) for name in given})


def _steps(prof, feed, graphed, train_step, reader) -> None:
    """The run's steps under the profiler: each its data, copy and step phases (or the
    CUDA graph's replay). Each step's loss is handed to the step reader, which reads it
    --run-ahead steps later in train mode on a GPU (profiling/step_reader.py): no
    host-device sync per step, so the host prepares the next steps while the GPU runs
    step k."""
    for step in prof.steps():
        raise_if_stopped()  # a signal whose KeyboardInterrupt some code swallowed ends here
        t0 = time.perf_counter()
        with step_range(step):
            if graphed is not None:
                loss = graphed.step(step, *feed.host())
            else:
                loss = train_step(*feed.take())
            # Copy ahead: the next batch's copies enqueued behind this step's work, on
            # their own stream; they run while the GPU runs this step. Not after the last
            # planned step: at an epoch's end the loader would stop its workers inside it.
            if step + 1 < prof.total:
                feed.prepare()
        reader.put(step, loss, t0, feed.waited_ms())
        # Release this step's loss here, outside every phase: kept, it would be freed by
        # the next step's assignment inside its ranges.
        del loss
        for read in reader.ready():  # waits for step k-run_ahead's end, if need be
            prof.record_step(read)
        prof.end_step(step)
        reader.loop_ended(step, t0)  # the loop's whole time for the step, its waits left out
    for read in reader.drain():
        prof.record_step(read)
    raise_if_stopped()


def _report(line: str) -> None:
    """The one line of an early end: on stderr, or, on a rank of training/launch.py's
    job, left for the launcher, which prints the line of the rank that failed first."""
    ranks = from_env()
    if not ranks.leave_error(line):
        where = f"rank {ranks.rank}: " if ranks.distributed else ""
        print(f"error: {where}{line}", file=sys.stderr)


def _ended_early(exc: BaseException) -> int:
    """Ctrl-C (the harness's RunInterrupted, or before the run), a user's mistake, a
    backend this machine lacks, a run that failed (its line says where its files went):
    core/errors.py gives each its line and exit code."""
    ignore_stop_signals()
    _report(interruption(exc) if isinstance(exc, KeyboardInterrupt) else one_line(exc))
    return exit_code(exc)


def main(argv=None) -> int:
    imports_done()  # the collector paused at the program's start resumes
    survive_closed_stdout()  # `| head` ends no run (core/output.py)
    stop_once()  # Ctrl-C or SIGTERM ends a run, once
    try:
        raise_if_stopped()  # one noted as the program started (its imports)
        run(parse_config(argv))
        raise_if_stopped()  # one that came as the run ended, swallowed on the way: not 0
        stop()  # leaves the process group of a torchrun job
        # The run is over (its files kept or removed): a further Ctrl-C or SIGTERM, while
        # the data workers and the interpreter shut down, must not turn the exit into a
        # traceback or a death by signal; noted, it turns the 0 into 130 (leave).
        note_stop_signals()
    except (KeyboardInterrupt, ProjectError) as exc:
        return _ended_early(exc)
    except Exception as exc:  # a bug: its traceback stays
        if (interrupt := wrapped_interrupt(exc)) is not None:  # Python wrapped a signal's
            return _ended_early(interrupt)
        from_env().leave_error(f"{type(exc).__name__}: {one_line(exc)} (a bug: its "
                               "traceback is in the job's output)")
        raise
    return 0


if __name__ == "__main__":
    leave(main())
