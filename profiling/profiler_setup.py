"""The profiler of a run and the writer of its TensorBoard scalars: made as a run starts,
closed within a bound as it ends early. profiling/harness.py drives them."""

import contextlib
import errno
import os
import sys
import tempfile
import threading
import warnings
from pathlib import Path

import torch

from core.bounded import finished_within
from core.errors import is_write_failure
from core.names import FUSED
from profiling.run_plan import RunPlan
from profiling.trace_events import quiet_cpu_profiler

# How long an early end waits for TensorBoard's writer to close (close_within).
WRITER_CLOSE_S = 2.0


def make_profiler(plan: RunPlan, run_dir: Path, cuda: bool, worker: str = "train",
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
        schedule=torch.profiler.schedule(wait=plan.wait, warmup=plan.warmup, active=plan.active,
                                         repeat=1),
        on_trace_ready=_then(_into_writable(run_dir, torch.profiler.tensorboard_trace_handler(
            str(run_dir), worker)), after_trace),
        record_shapes=plan.memory_snapshot, profile_memory=_memory_worth_profiling(plan),
        with_stack=plan.memory_snapshot)


def _into_writable(run_dir: Path, handler):
    """handler(prof), while run_dir can still be written: the run ends on an OSError naming
    the folder, not on kineto's own ERROR line (it writes from C++). The folder can turn
    read-only between the check and the write, so kineto's words are taken aside and
    dropped where it did."""
    def handle(prof):
        _refuse_unwritable(run_dir)
        said: list[bytes] = []
        try:
            with _c_stderr_aside(said):
                handler(prof)
        finally:
            if said and os.access(run_dir, os.W_OK):  # not about the folder: the user's
                os.write(2, said[0])
        _refuse_unwritable(run_dir)
    return handle


def _refuse_unwritable(run_dir: Path) -> None:
    if not os.access(run_dir, os.W_OK):
        read_only = os.statvfs(run_dir).f_flag & os.ST_RDONLY
        code = errno.EROFS if read_only else errno.EACCES
        raise OSError(code, os.strerror(code), str(run_dir))


@contextlib.contextmanager
def _c_stderr_aside(said: list[bytes]):
    """File descriptor 2 (C++'s std::cerr as well as Python's stderr) into a temporary
    file for the block; then `said` gets the bytes written there, for the caller to pass
    on or drop. Where no temporary file can be made, stderr stays as it is."""
    try:
        spool = tempfile.TemporaryFile()
    except OSError:
        yield
        return
    sys.stderr.flush()
    saved = os.dup(2)
    os.dup2(spool.fileno(), 2)
    try:
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)
        spool.seek(0)
        text = spool.read()
        spool.close()
        if text:
            said.append(text)


def _then(first, second):
    """first, then second (where given), on the same arguments."""
    if second is None:
        return first

    def both(*args):
        first(*args)
        second(*args)
    return both


def _memory_worth_profiling(plan: RunPlan) -> bool:
    """Memory events for TensorBoard's memory view, except where Triton's interpreter runs
    a kernel of the step (a CPU run of a fused strategy or a Triton block): it keeps a
    block of each launch alive into the next launch, so the first profiled step frees a
    block made before the profiler started and c10 prints 'CPUAllocator.cpp:245 Memory
    block of unknown size...'."""
    interpreted = os.environ.get("TRITON_INTERPRET") == "1"
    return not (interpreted and (plan.loss in FUSED or plan.runs_triton))


def close_within(writer, seconds: float) -> None:
    """writer.close(), `seconds` at most: a Ctrl-C raised inside the writer's add_scalar
    can lose its thread's wakeup, and close() then waited for the thread's 120 s flush
    timer. Past the bound the last steps' scalars may be lost, not the run's folder."""
    finished_within(lambda: close_ending(writer), seconds, "close the scalars")


def close_ending(writer) -> None:
    """writer.close() as a run ends early; a write it cannot finish (a full or read-only
    disk) is dropped: the run's line already says so, and the writer's thread printed a
    traceback of 30 lines beside it."""
    try:
        writer.close()
    except OSError as exc:
        if not is_write_failure(exc):
            raise


def quiet_writer_thread() -> None:
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


class NoScalars:
    """The SummaryWriter of ranks other than 0: TensorBoard gets one set of scalars."""

    def add_scalar(self, *args) -> None:
        pass

    def close(self) -> None:
        pass
