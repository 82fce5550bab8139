"""Everything around a training loop that makes it a profiled run: the run folder, the
profiler and its schedule, TensorBoard scalars, a progress line per step, and at the end
the gzipped trace and summary.json. train.py's loop runs inside it:

    with ProfiledRun(cfg, label, phases, cuda) as run:
        for step in run.steps():
            ...                                  # the phases, each a record_function
            for read in reader.ready():          # profiling/step_reader.py: a step's loss
                run.record_step(read)            # and times, read --run-ahead steps later
            run.end_step(step)                   # the profiler moves on
    run.record                                   # what summary.json holds

On several ranks (a torchrun job, training/ranks.py) rank 0 makes the folder and every
rank writes its own trace into it (worker name rank<r>); at the end the ranks' summaries
and communication figures are gathered and rank 0 writes the one summary.json
(profiling/scaling.py). Only rank 0 prints and writes TensorBoard scalars.

A run that ends early (Ctrl-C, SIGTERM, an error in a data worker or in the loop, a failed
trace write) never leaves a folder that looks complete: the profiled steps that completed
are gzipped and summarized into <name>-interrupted or <name>-failed, a bug's traceback
goes beside them, and a folder with nothing worth keeping is removed. The exception then
goes on as RunInterrupted or RunFailed, whose message is the one line to print. On several
ranks only rank 0 keeps, marks or removes the folder; the others drop their unfinished
trace.
"""

import dataclasses
import errno
import json
import math
import os
import threading
import time
import traceback
import warnings
from pathlib import Path

import torch

from core import run_folder
from core.bounded import finished_within
from core.errors import (
    NonFiniteLoss,
    RunFailed,
    RunInterrupted,
    UserError,
    interruption,
    is_write_failure,
    one_line,
)
from core.files import write_whole
from core.names import FUSED
from core.signals import ignore_stop_signals, stop_signal, stop_signals_held
from profiling import (
    compile_account,
    flops,
    gpu_clocks,
    memory_account,
    memory_page,
    report_page,
)
from profiling.communication import communication
from profiling.environment import environment
from profiling.scaling import combine, format_ranks, scaling
from profiling.step_reader import data_wait, describe, pace, reader_lag, sustained, tail
from profiling.table import format_table
from profiling.trace_events import find_trace, load_trace, quiet_cpu_profiler
from profiling.trace_summary import not_measured_on_a_cpu, step_device_ms, summarize
from profiling.trace_writer import gzip_traces, remove_plain_traces
from training import job_notes, speedups
from training.ddp import knobs
from training.ranks import (
    Ranks,
    abandon_nccl,
    launcher_gone,
    peer_cause,
    peer_line,
    set_hang_timeout,
    stop_watching,
)


def make_profiler(cfg, run_dir: Path, cuda: bool, worker: str = "train",
                  after_trace=None) -> torch.profiler.profile:
    """wait/warmup/active schedule; the Chrome trace goes into the run folder when the
    active steps end (plain JSON, gzipped afterwards: profiling/trace_writer.py), named
    for the worker (a rank of a job); then after_trace(prof), where given. With
    --memory-snapshot, shapes and Python stacks as well, which torch.profiler's memory
    categories need: the host's times grow (the trace records every Python call), the
    GPU's do not."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if cuda:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    else:
        quiet_cpu_profiler()
    # torch 2.11 warns, at each run's window, that a profiler of several cycles keeps only
    # the last one's events: a schedule of one cycle (repeat=1) has nothing else.
    warnings.filterwarnings("ignore", message="Warning: Profiler clears events")
    return torch.profiler.profile(
        activities=activities,
        schedule=torch.profiler.schedule(wait=cfg.wait, warmup=cfg.warmup, active=cfg.active,
                                         repeat=1),
        on_trace_ready=_then(_into_writable(run_dir, torch.profiler.tensorboard_trace_handler(
            str(run_dir), worker)), after_trace),
        record_shapes=cfg.memory_snapshot, profile_memory=_memory_worth_profiling(cfg),
        with_stack=cfg.memory_snapshot)


def _into_writable(run_dir: Path, handler):
    """handler(prof), once run_dir can still be written. Kineto writes the trace from C++,
    and into a folder gone read-only it printed its own ERROR line beside the run's; the
    run now ends on an OSError naming the folder, as for any other write."""
    def handle(prof):
        if not os.access(run_dir, os.W_OK):
            read_only = os.statvfs(run_dir).f_flag & os.ST_RDONLY
            code = errno.EROFS if read_only else errno.EACCES
            raise OSError(code, os.strerror(code), str(run_dir))
        handler(prof)
    return handle


def _then(first, second):
    """first, then second (where given), on the same arguments."""
    if second is None:
        return first

    def both(*args):
        first(*args)
        second(*args)
    return both


def _memory_worth_profiling(cfg) -> bool:
    """Memory events for TensorBoard's memory view, except where Triton's interpreter runs
    a kernel of the step (a CPU run of a fused strategy or a Triton block): it keeps a
    block of each launch alive into the next launch, so the first profiled step frees a
    block made before the profiler started and c10 prints 'CPUAllocator.cpp:245 Memory
    block of unknown size...'."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return not (interpreted and (cfg.loss in FUSED or speedups.runs_triton(cfg)))


# Runs of up to this many steps print a line every step; longer ones fewer
# (ProfiledRun._worth_a_line).
LINE_EVERY_STEP_UP_TO = 500

# How long an early end waits for TensorBoard's writer to close (close_within).
WRITER_CLOSE_S = 2.0


def close_within(writer, seconds: float) -> None:
    """writer.close(), `seconds` at most. A Ctrl-C raised inside the writer's add_scalar,
    in its queue's Condition, can lose its thread's wakeup; close() then waited in join()
    for that thread's 120 s flush timer. A rank 0 stuck there past torchrun's 30 s was
    killed and its folder marked -failed by the launcher (2 Ctrl-C in 20 under load;
    py-spy: the main thread in _AsyncWriterThread.stop's join, the writer's thread in
    Queue.get). Past the bound the last steps' scalars may be lost, not the run's folder."""
    finished_within(lambda: _close_ending(writer), seconds, "close the scalars")


def _close_ending(writer) -> None:
    """writer.close() as a run ends early; a write it cannot finish (a full or read-only
    disk) is dropped: the run's line already says so, and the writer's thread printed a
    traceback of 30 lines beside it."""
    try:
        writer.close()
    except OSError as exc:
        if not is_write_failure(exc):
            raise


def _quiet_writer_thread() -> None:
    """TensorBoard's writer thread meets a full or read-only disk first and prints its
    traceback (30 lines), then the main thread's next add_scalar raises the same error,
    which ends the run with its one line: the thread's report is dropped (once per
    process; any other thread's exception is reported as before)."""
    report = threading.excepthook
    if getattr(report, "quiet_writer", False):
        return

    def hook(args) -> None:
        if type(args.thread).__name__ == "_AsyncWriterThread" and \
                is_write_failure(args.exc_value):
            return
        report(args)
    hook.quiet_writer = True
    threading.excepthook = hook


class _NoScalars:
    """The SummaryWriter of ranks other than 0: TensorBoard gets one set of scalars."""

    def add_scalar(self, *args) -> None:
        pass

    def close(self) -> None:
        pass


class ProfiledRun:
    def __init__(self, cfg, label: str, phases: tuple[str, ...], cuda: bool,
                 out_dir: Path, run_name: str, used: dict | None = None,
                 ranks: Ranks = Ranks(),  # noqa: B008 (a frozen dataclass: one process)
                 facts: dict | None = None):
        self.cfg, self.label, self.phases, self.cuda = cfg, label, phases, cuda
        self.speedups = used  # what training/speedups.resolve says this run uses
        self.facts = facts or {}  # more of what the run used, for summary.json
        self.ranks = ranks
        self.out_dir, self.run_name = out_dir, run_name
        self.window = cfg.wait + cfg.warmup + cfg.active  # the profiler's steps
        self.total = max(cfg.steps, self.window)  # planned; --seconds may end it sooner
        self.done = 0          # steps completed
        self.losses: list[float] = []
        self._last_line = 0.0  # when the last progress line was printed (time.monotonic)
        self.step_times: list[dict] = []  # each step's host and device ms, as read
        self.record: dict | None = None
        self.dir: Path | None = None
        self.memory = None  # --memory-snapshot: the allocator's history over the window
        self.memory_timeline: dict | None = None  # and the profiler's, by category
        self.clocks = None  # rank 0's GPU: its clocks over the sustained steps
        self.clocks_summary: dict | None = None
        self.writer = self.profiler = None  # made by __enter__

    # -- the loop's side -------------------------------------------------------------
    def __enter__(self):
        try:
            return self._enter()
        except BaseException:
            self._undo_enter()
            raise

    def _undo_enter(self) -> None:
        """An __enter__ cut short (a Ctrl-C or SIGTERM as it ran, or an error) leaves no
        folder: no __exit__ follows it, and a SIGTERM between the folder's making and the
        writer's left an empty, unmarked one (1 of 150 moments of a short run's life,
        under load). Nothing was profiled, so nothing is kept."""
        for undo in (lambda: self.profiler is not None and self.profiler.__exit__(None, None,
                                                                                   None),
                     lambda: self.writer is not None and _close_ending(self.writer)):
            try:
                undo()
            except Exception:  # noqa: BLE001 (the first error is the one to report)
                pass
        if self.dir is not None and self.ranks.main:
            run_folder.remove(self.dir)
            job_notes.settled()

    def _enter(self):
        from torch.utils.tensorboard import SummaryWriter
        ranks = self.ranks
        # Rank 0 names the folder (never an existing one); every rank writes into it.
        self.dir = ranks.share(lambda: run_folder.new_run_dir(self.out_dir, self.run_name))
        set_hang_timeout(None)  # this run's first steps may compile (a run before it did not)
        if ranks.main:  # for the launcher, should this process die unable to mark it
            job_notes.running(self.dir, dataclasses.asdict(self.cfg), self.total)
        self.writer = SummaryWriter(str(self.dir)) if ranks.main else _NoScalars()
        _quiet_writer_thread()
        self.compiled_before = compile_account.begin()  # this run's compiles: what comes after
        after_trace = None
        if self.cfg.memory_snapshot:  # train.validate: one process on a GPU
            self.memory = memory_account.AllocatorHistory(self.dir / memory_account.SNAPSHOT)
            after_trace = self._memory_by_category
        self.profiler = make_profiler(self.cfg, self.dir, self.cuda, ranks.worker_name(),
                                      after_trace)
        self.profiler.__enter__()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        if self.memory and self.cfg.wait + self.cfg.warmup == 0:
            self.memory.start()  # the first step is profiled
        self._exiting = False  # __exit__ says why
        if self.cuda and ranks.main:
            # Last: an __enter__ that raised after it would leave the sampler running, as
            # no __exit__ stops it, until the process ends (make compare's next runs).
            self.clocks = gpu_clocks.Sampler.start(
                self.dir / "gpu_clocks.csv", gpu_clocks.gpu_id(torch.cuda.current_device()))
        return self

    def say(self, text: str) -> None:
        """A progress line, from rank 0 only."""
        if self.ranks.main:
            print(f"[{self.label}] {text}", flush=True)

    def steps(self):
        """The run's step numbers; past the profiled window, none once --seconds of steps
        have gone by."""
        started = time.perf_counter()
        for step in range(self.total):
            if (step >= self.window and self.cfg.seconds
                    and time.perf_counter() - started > self.cfg.seconds):
                self.say(f"{self.cfg.seconds:g} s of steps reached: the run ends after "
                         f"{step} of {self.total} steps")
                return
            if self.clocks and step == self._first_sustained():
                self.clocks.mark()
            yield step

    def schedule_of(self, step: int) -> str:
        """Where a step falls in the profiler's schedule: wait, warmup or profiled."""
        cfg = self.cfg
        return ("wait" if step < cfg.wait else
                "warmup" if step < cfg.wait + cfg.warmup else
                "profiled" if step < self.window else "unprofiled")

    def record_step(self, read) -> None:
        """A step's loss and times, as profiling/step_reader.py read them (--run-ahead
        steps late on a GPU): the NaN check, the scalars and the progress line."""
        step, loss = read.step, read.loss
        if not math.isfinite(loss):
            raise NonFiniteLoss(f"the loss is {loss} at step {step + 1}: check --lr and the "
                                "data")
        self.losses.append(loss)
        self.step_times.append({"host_ms": round(read.host_ms, 4),
                                "device_ms": None if read.device_ms is None
                                else round(read.device_ms, 4),
                                "data_ms": round(read.data_ms, 4)})
        self.writer.add_scalar("loss", loss, step)
        self.writer.add_scalar("step_time_ms", read.host_ms, step)
        device = ""
        if read.device_ms is not None:
            self.writer.add_scalar("step_device_ms", read.device_ms, step)
            device = f", {read.device_ms:.1f} ms on the device"
        if self._worth_a_line(step):
            self.say(f"step {step + 1}/{self.total} ({self.schedule_of(step)}) loss "
                     f"{loss:.4f} {read.host_ms:.1f} ms{device}")

    def _worth_a_line(self, step: int) -> bool:
        """Every step of a run of up to LINE_EVERY_STEP_UP_TO steps; in a longer one (an
        epoch: 976 steps at the GPU preset, 31,250 at the CPU's) the first 20, those of
        the profiled window, the last, and one at least every 2 s between."""
        now = time.monotonic()
        if (self.total <= LINE_EVERY_STEP_UP_TO or step < 20 or step + 1 == self.total
                or self.schedule_of(step) in ("warmup", "profiled")
                or now - self._last_line >= 2.0):
            self._last_line = now
            return True
        return False

    def end_step(self, step: int) -> None:
        """A step's work is enqueued: the profiler moves on to the next."""
        if self.cuda and step + 1 == self.window:
            # host-device sync: once a run, at the profiled window's end, so that its
            # trace holds every kernel of its last step (the host runs steps ahead).
            torch.cuda.synchronize()
        if self.memory and step + 1 == self.cfg.wait + self.cfg.warmup:
            self.memory.start()  # the next step is the first profiled one
        if self.memory and step + 1 == self.window:
            self.say("writing the allocator's snapshot...")
            self.memory.stop()
        if self.clocks:
            self.clocks.step_ended()
        self.done = step + 1
        if self.done == max(self.cfg.settle, 1):  # compiled and tuned: a long wait is a hang
            set_hang_timeout(self.cfg.hang_timeout)
        # Ctrl-C or SIGTERM inside the profiler's step transition could leave it unable to
        # write the trace of the steps already done: the signal waits until it is over.
        with stop_signals_held():
            self.profiler.step()

    def __exit__(self, exc_type, exc, tb):
        try:
            return self._exit_holding_signals(exc_type, exc, tb)
        except KeyboardInterrupt as late:
            if self._exiting:
                raise  # the exit's own end (RunInterrupted), or a signal it let through
            # Ctrl-C or SIGTERM landed before _exit_holding_signals held the signals:
            # torchrun's SIGTERM does so at times on rank 0, already ending on its peer's
            # death, and the folder was left unmarked. The run ends as interrupted, and
            # marks its folder; core.signals.stop_once drops any further signal.
            return self._exit_holding_signals(type(late), late, late.__traceback__)

    def _exit_holding_signals(self, exc_type, exc, tb):
        # Writing the trace and the summary takes seconds (the loop's trace at batch 128:
        # 6.6 s): a Ctrl-C or SIGTERM meanwhile is held, so that it cannot cut the files
        # short. A complete run then ends as interrupted, its folder complete; a run
        # already ending early ends as it was going to.
        profiled = self._profiled_done()
        what = f"the trace of {profiled} profiled steps" if profiled else "the run's folder"
        if exc is not None and not profiled:
            what = None  # ending early with no profiled step: nothing is written or kept
        with stop_signals_held(act=exc is None, say=self.say, what=what):
            return self._exit(exc_type, exc, tb)

    def _profiled_done(self) -> int:
        """The profiled steps that completed so far."""
        return min(self.cfg.active, max(0, self.done - self.cfg.wait - self.cfg.warmup))

    def _exit(self, exc_type, exc, tb):
        self._exiting = True  # signals are held from here on (__exit__)
        if exc is None:
            # Rank 0 writes and summarizes its trace while the others wait in the gather
            # (a loop run's trace: tens of seconds): the steps' --hang-timeout is not for it.
            set_hang_timeout(None)
        if self.clocks:  # the steps are over, however the run ends
            self.clocks_summary = self.clocks.stop()
        if self.memory:
            self.memory.abandon()  # an early end within the window: recording stops
        if exc is not None and self.ranks.distributed:
            # A rank ending early: a second Ctrl-C or SIGTERM (the terminal's and
            # torchrun's, which stops every rank once one has ended) must not cut its
            # trace or folder work short.
            ignore_stop_signals()
            if not isinstance(exc, UserError):  # a refusal is every rank's, in step
                abandon_nccl()  # a collective left waiting must not hold the GPU's streams
            if not self.ranks.main:
                # Only rank 0 keeps an early end's steps: the others write no trace (into
                # a folder that rank 0 may be renaming).
                self.profiler.on_trace_ready = None
        try:
            self.profiler.__exit__(exc_type, exc, tb)  # writes the trace if steps were active
        except BaseException as trace_exc:  # noqa: BLE001 (a failed write is an early end)
            exc = exc or trace_exc
        if exc is None:
            try:
                self._finish()
                return False
            except BaseException as finish_exc:  # noqa: BLE001
                exc = finish_exc
        self._end_early(exc)
        return False  # not reached: _end_early raises

    def _write(self, summary: dict, exc: BaseException | None = None) -> None:
        """summary.json, and error.txt with the traceback of a bug (not of a user error)."""
        # Whole or not at all: a full disk must not leave a summary.json that looks
        # complete but is cut short.
        write_whole(self.dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        report_page.write(self.dir, summary)  # a page to open, whatever the status
        if exc is not None and not isinstance(exc, UserError):
            write_whole(self.dir / "error.txt", "".join(traceback.format_exception(exc)))

    # -- the end of a complete run -----------------------------------------------------
    def _summary(self, status: str, profiled: int | None = None, **extra) -> dict:
        trace = find_trace(self.dir, self.ranks.worker_name())
        events = load_trace(trace)
        summary = summarize(events, self.phases, max_steps=profiled)
        if not self.cuda:
            summary = not_measured_on_a_cpu(summary)
        if self.ranks.distributed:
            summary["communication"] = communication(events, self.phases, profiled)
        env = environment()
        title = self._title(env["device"])
        if status != "complete":
            title += f" ({status} after {summary['steps']} profiled steps)"
        table = format_table(summary, title, on_gpu=self.cuda)
        first = self._first_sustained()
        rate = sustained(self.step_times, first, self.cfg.batch_size * self.ranks.world)
        busy = self._busy_fraction(summary)
        wait = data_wait(self.step_times, first)
        slow = tail(self.step_times, first, reader_lag(self.cfg, self.cuda))
        paced = pace(self.step_times, first)
        model_flops = self._model_flops(summary, rate, env["device"])
        table += "\n" + flops.describe(model_flops, "the step's device time", env["device"],
                                       self.cfg.mode)
        first_ms = sum(t["host_ms"] for t in self.step_times[:self.cfg.settle])
        compiled = compile_account.account(self.compiled_before, first_ms)
        if compiled:
            table += "\n" + compile_account.describe(compiled, self.cfg.settle)
        if rate:
            loader = self.facts.get("batches", {}).get("loader_rate")
            table += "\n" + describe(rate, busy, wait, loader, self.cfg.batch_size, slow,
                                      paced)
            clocks = gpu_clocks.describe(self.clocks_summary)
            if clocks:
                table += "\n" + clocks
        memory = self._memory_account(status)
        if memory:
            table += "\n" + memory_account.describe(memory)
        return {"status": status, **extra,
                "config": dataclasses.asdict(self.cfg), "speedups": self.speedups,
                **self.facts,
                "environment": env, "trace": trace.name, "table": table,
                "step_times": self.step_times, "sustained": rate, "gpu_busy_fraction": busy,
                "data_wait": wait, "tail": slow, "pace": paced,
                "gpu_clocks": self.clocks_summary,
                "flops": model_flops,
                "compile": compiled,
                "steps_run": self.done,
                "losses": self.losses,
                "peak_gpu_memory_gb": self._peak_gb(), "memory": memory,
                **summary}

    def _first_sustained(self) -> int:
        """The first step of the sustained rate: the steps before it compile and tune. A
        CUDA graph is captured at the last --wait step: not a step of the steady state."""
        cfg = self.cfg
        return max(cfg.settle, cfg.wait) if "graph" in self.phases else cfg.settle

    def _title(self, device: str) -> str:
        return f"{self.label}, {self.cfg.mode} mode, batch {self.cfg.batch_size}, {device}"

    def _peak_gb(self) -> float | None:
        """The run's peak allocated GB (the allocator's counter), on a GPU."""
        if not self.cuda:
            return None
        peak = self.memory.run_peak() if self.memory else torch.cuda.max_memory_allocated()
        return peak / 1e9

    def _memory_by_category(self, prof) -> None:
        """After the trace is written: torch.profiler's memory timeline by category."""
        self.say("sorting the profiled steps' memory into categories...")
        device = f"cuda:{torch.cuda.current_device()}"
        self.memory_timeline = memory_account.by_category(prof, device)

    def _memory_account(self, status: str) -> dict | None:
        """--memory-snapshot's figures; its page only for a complete run (an early end's
        window is not whole), written by _write_memory_page."""
        if not self.memory:
            return None
        page = None
        if status == "complete" and self.memory_timeline is not None and self.memory.result:
            page = "memory.html"
        return memory_account.account(self.memory.result, self.memory_timeline, page)

    def _write_memory_page(self, record: dict) -> None:
        """The page and its points beside the run, where its account names a page."""
        memory = record.get("memory")
        if memory and memory["page"]:
            title = self._title(record["environment"]["device"])
            memory_page.write(self.dir / memory["page"], title, self.memory_timeline, memory)
            write_whole(self.dir / memory_account.TIMELINE, json.dumps(self.memory_timeline))

    def _model_flops(self, summary: dict, rate: dict | None, device: str) -> dict:
        """The model's FLOPs a step of this rank's batch (profiling/flops.py) and the MFU
        over the step's device time (its GPU busy time, the union over its streams:
        profiling/flops.py says why not its GPU time summed over streams); with a
        sustained rate, also the MFU at that rate (each rank's share of the job's samples:
        every --parallel design does a rank's batch's FLOPs a rank, tp's shards of the
        global batch included)."""
        cfg = self.cfg
        per_step = flops.step_flops(cfg.batch_size, cfg.image_size, cfg.max_boxes, cfg.hidden,
                                    cfg.mode)
        gpu_s = step_device_ms(summary["step"]) / 1e3 if self.cuda else None
        account = flops.utilisation(per_step, gpu_s, device if self.cuda else None)
        if rate and self.cuda:
            step_s = cfg.batch_size * self.ranks.world / rate["samples_per_s"]
            at_rate = flops.utilisation(per_step, step_s, device)
            account["sustained_tflop_per_s"] = at_rate["tflop_per_s"]
            account["sustained_mfu"] = at_rate["mfu"]
        return account

    def _busy_fraction(self, summary: dict) -> float | None:
        """The profiled steps' GPU busy time (the union of their kernels, copies and memsets
        over every stream, from the trace) over their time on the device (the step reader's events):
        how much of each step the GPU was kept busy. None without device times."""
        start = self.cfg.wait + self.cfg.warmup
        window = self.step_times[start:start + summary["steps"]]
        device = [t["device_ms"] for t in window if t["device_ms"] is not None]
        if not device or len(device) < len(window) or not self.cuda:
            return None
        return step_device_ms(summary["step"]) * len(device) / sum(device)

    def _finish(self) -> None:
        self.say("writing the trace...")
        t0 = time.perf_counter()
        gzip_traces(self.dir, self.ranks.worker_name())
        record = self._summary("complete")
        self._write_memory_page(record)
        trace = self.dir / record["trace"]
        self.say(f"trace {trace.name} ({trace.stat().st_size / 1e6:.1f} MB) gzipped and "
                 f"summarized in {time.perf_counter() - t0:.1f} s")
        if self.ranks.distributed:
            record = self._job_record(record)
            if record is None:
                return  # ranks other than 0: rank 0 writes the job's summary
        for name, p in record["phases"].items():
            self.writer.add_scalar(f"phase_cpu_ms/{name}", p["cpu_ms"], 0)
            if p["gpu_ms"] is not None:  # None: not measured (a CPU run)
                self.writer.add_scalar(f"phase_gpu_ms/{name}", p["gpu_ms"], 0)
        self.writer.close()
        self._write(record)
        job_notes.settled()
        print(record["table"])
        if "distributed" in record:
            print(format_ranks(record))
        print(f"written: {run_folder.display(self.dir / 'summary.json')}")
        print(f"page: {run_folder.display(self.dir / report_page.PAGE)} (open it in a browser)")
        record["run_dir"] = str(self.dir)
        self.record = record

    def _job_record(self, record: dict) -> dict | None:
        """Every rank's summary gathered; on rank 0 the job's record, None elsewhere."""
        mine = {k: record[k] for k in ("trace", "steps", "phases", "step", "communication",
                                       "peak_gpu_memory_gb")}
        per_rank = self.ranks.gather(mine)
        if not self.ranks.main:
            return None
        import torch.distributed as dist
        job = combine(record, per_rank, self.ranks.world, dist.get_backend())
        job["ddp"] = knobs(self.cfg)
        job["distributed"]["parallel"] = self.cfg.parallel
        if self.cfg.scaling_baseline:
            job["distributed"]["scaling"] = scaling(job, self.cfg.scaling_baseline)
        return job

    # -- an early end --------------------------------------------------------------------
    def _end_early(self, exc: BaseException):
        interrupted = isinstance(exc, KeyboardInterrupt)
        status = "interrupted" if interrupted else "failed"
        user_error = isinstance(exc, UserError)
        at = (f"after step {self.done} of {self.total}" if self.done == self.total else
              f"at step {self.done + 1} of {self.total}")
        if is_write_failure(exc) and not exc.filename:
            # A write (not an open) that the disk refused names no file: name the folder
            # it was writing into ("could not write: No space left on device" named none).
            exc.filename = str(self.dir)
        # one_line of a worker's death ends "Killed.": "at step N" follows it
        reason = interruption(exc) if interrupted else one_line(exc).rstrip(".")
        stop_watching()
        # A dead launcher or peer: what this rank met first (a closed socket, a line of
        # DDP's hook) is not the cause.
        gone = launcher_gone() or (self.ranks.distributed and not interrupted and
                                   peer_cause(exc, self.ranks.rank, self.ranks.world))
        if gone:
            interrupted, status, reason = False, "failed", gone
        elif interrupted and self.ranks.distributed and \
                job_notes.stopped_for_a_failure(str(exc)):
            # torchrun's SIGTERM after another rank failed, not the user's: it labelled
            # the run -interrupted (under gloo when met before the peer's closed socket,
            # under NCCL always).
            interrupted, status = False, "failed"
            reason = (peer_line(self.ranks.rank, self.ranks.world) or
                      "another rank failed; the launcher stopped this one")
        elif not interrupted and not user_error and stop_signal():
            # A stop signal came, then the run failed: the signal that reached the whole
            # group killed a data worker before it had its own handler, and the loader
            # said "worker killed by signal" before the KeyboardInterrupt came through.
            interrupted, status = True, "interrupted"
            reason = f"interrupted ({stop_signal()})"
        close_within(self.writer, WRITER_CLOSE_S)
        if self.ranks.distributed:
            # A rank ending early: a second Ctrl-C or SIGTERM (the terminal's and
            # torchrun's, which stops every rank once one has ended) must not cut its
            # trace or folder work short.
            ignore_stop_signals()
            if not self.ranks.main:
                remove_plain_traces(self.dir, self.ranks.worker_name())
                self.ranks.let_go(self.dir.name)
                raise (RunInterrupted if interrupted else RunFailed)(f"{reason} {at}") from exc
            if interrupted:  # every rank is alive and ending: none may be writing into
                self.ranks.wait_for_others(self.dir.name)  # the folder as it is renamed
        profiled = self._profiled_done()
        kept = None
        if profiled:
            kept = self._keep_completed_steps(status, reason, profiled, exc)
        elif status == "failed" and not user_error:
            kept = self._keep_error_only(reason, exc)
        if kept is None:
            left = run_folder.remove(self.dir)
            where = "nothing kept" if left is None else (
                f"{run_folder.display(self.dir)} could not be removed ({left.strerror}): "
                "it holds what was written before")
        else:
            where = kept
        job_notes.settled()
        if interrupted:
            raise RunInterrupted(f"{reason} {at}; {where}") from exc
        if user_error and kept is None:
            raise RunFailed(reason) from exc
        raise RunFailed(f"run failed {at}: {reason}; {where}") from exc

    def _keep_completed_steps(self, status, reason, profiled, exc) -> str | None:
        """Gzips and summarizes the profiled steps that completed; None if that fails."""
        try:
            gzip_traces(self.dir, self.ranks.worker_name())
            self._drop_other_ranks_plain_traces()
            record = self._summary(status, profiled, reason=reason,
                                   completed_steps=self.done, planned_steps=self.total)
            self._write(record, exc if status == "failed" else None)
            marked = run_folder.mark(self.dir, status)
        except BaseException:  # noqa: BLE001 (nothing half-written is kept)
            return None
        return f"{run_folder.display(marked)} holds the {profiled} profiled steps that completed"

    def _drop_other_ranks_plain_traces(self) -> None:
        """Rank 0, keeping an early end's folder: the other ranks' plain traces go. Each
        drops its own as it ends early, but one that does so after rank 0 renamed the
        folder finds nothing, and its trace stayed unpacked in the -failed folder."""
        for rank in range(1, self.ranks.world):
            remove_plain_traces(self.dir, f"rank{rank}")

    def _keep_error_only(self, reason, exc) -> str | None:
        """A bug before any profiled step: its traceback, in a folder marked failed."""
        try:
            remove_plain_traces(self.dir, self.ranks.worker_name())
            self._drop_other_ranks_plain_traces()
            self._write({"status": "failed", "reason": reason, "completed_steps": self.done,
                         "planned_steps": self.total, "config": dataclasses.asdict(self.cfg)},
                        exc)
            marked = run_folder.mark(self.dir, "failed")
        except BaseException:  # noqa: BLE001
            return None
        return f"traceback in {run_folder.display(marked / 'error.txt')}"
