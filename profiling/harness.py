"""Everything around a training loop that makes it a profiled run: the run folder, the
profiler, the scalars, a progress line a step, and at the end the trace and summary.json;
on several ranks rank 0 alone prints and writes the summary. This file is the run's
lifecycle; profiler_setup, run_record and early_end are its other rooms.
Its design in full: docs/design.md."""

import math
import time
from pathlib import Path

import torch

from core import run_folder
from core.errors import NonFiniteLoss, UserError
from core.signals import ignore_stop_signals, stop_signals_held
from profiling import compile_account, gpu_clocks, memory_account
from profiling.early_end import EarlyEnd
from profiling.profiler_setup import NoScalars, close_ending, make_profiler, quiet_writer_thread
from profiling.run_plan import RunPlan
from profiling.run_record import RunRecord
from training import job_notes
from training.ranks import Ranks, abandon_nccl, set_hang_timeout

# Runs of up to this many steps print a line every step; longer ones fewer
# (ProfiledRun._worth_a_line).
LINE_EVERY_STEP_UP_TO = 500


class ProfiledRun(RunRecord, EarlyEnd):
    def __init__(self, plan: RunPlan, label: str, phases: tuple[str, ...], cuda: bool,
                 out_dir: Path, run_name: str, used: dict | None = None,
                 ranks: Ranks = Ranks(),  # noqa: B008 (a frozen dataclass: one process)
                 facts: dict | None = None):
        self.plan, self.label, self.phases, self.cuda = plan, label, phases, cuda
        self.speedups = used  # what training/speedups.resolve says this run uses
        self.facts = facts or {}  # more of what the run used, for summary.json
        self.ranks = ranks
        self.out_dir, self.run_name = out_dir, run_name
        self.window = plan.wait + plan.warmup + plan.active  # the profiler's steps
        self.total = max(plan.steps, self.window)  # planned; --seconds may end it sooner
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
        folder: no __exit__ follows it, and nothing was profiled."""
        for undo in (lambda: self.profiler is not None and self.profiler.__exit__(None, None,
                                                                                   None),
                     lambda: self.writer is not None and close_ending(self.writer)):
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
            job_notes.running(self.dir, self.plan.config, self.total)
        self.writer = SummaryWriter(str(self.dir)) if ranks.main else NoScalars()
        quiet_writer_thread()
        self.compiled_before = compile_account.begin()  # this run's compiles: what comes after
        after_trace = None
        if self.plan.memory_snapshot:  # train.validate: one process on a GPU
            self.memory = memory_account.AllocatorHistory(self.dir / memory_account.SNAPSHOT)
            after_trace = self._memory_by_category
        self.profiler = make_profiler(self.plan, self.dir, self.cuda, ranks.worker_name(),
                                      after_trace)
        self.profiler.__enter__()
        if self.cuda:
            torch.cuda.reset_peak_memory_stats()
        if self.memory and self.plan.wait + self.plan.warmup == 0:
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
            if (step >= self.window and self.plan.seconds
                    and time.perf_counter() - started > self.plan.seconds):
                self.say(f"{self.plan.seconds:g} s of steps reached: the run ends after "
                         f"{step} of {self.total} steps")
                return
            if self.clocks and step == self.first_sustained():
                self.clocks.mark()
            yield step

    def schedule_of(self, step: int) -> str:
        """Where a step falls in the profiler's schedule: wait, warmup or profiled."""
        plan = self.plan
        return ("wait" if step < plan.wait else
                "warmup" if step < plan.wait + plan.warmup else
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
                                "data_ms": round(read.data_ms, 4),
                                "loop_ms": None if read.loop_ms is None
                                else round(read.loop_ms, 4)})
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
        if self.memory and step + 1 == self.plan.wait + self.plan.warmup:
            self.memory.start()  # the next step is the first profiled one
        if self.memory and step + 1 == self.window:
            self.say("writing the allocator's snapshot...")
            self.memory.stop()
        if self.clocks:
            self.clocks.step_ended(last=step + 1 == self.total)
        self.done = step + 1
        if self.done == max(self.plan.settle, 1):  # compiled and tuned: a long wait is a hang
            set_hang_timeout(self.plan.hang_timeout)
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
        profiled = self.profiled_done()
        what = f"the trace of {profiled} profiled steps" if profiled else "the run's folder"
        if exc is not None and not profiled:
            what = None  # ending early with no profiled step: nothing is written or kept
        with stop_signals_held(act=exc is None, say=self.say, what=what):
            return self._exit(exc_type, exc, tb)

    def profiled_done(self) -> int:
        """The profiled steps that completed so far."""
        return min(self.plan.active, max(0, self.done - self.plan.wait - self.plan.warmup))

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
                self.finish()
                return False
            except BaseException as finish_exc:  # noqa: BLE001
                exc = finish_exc
        self.end_early(exc)
        return False  # not reached: end_early raises
