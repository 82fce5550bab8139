"""A run that ends early (Ctrl-C, SIGTERM, an error in a data worker or in the loop, a
failed trace write) never leaves a folder that looks complete: the profiled steps that
completed are gzipped and summarized into <name>-interrupted or <name>-failed, a bug's
traceback goes beside them, and a folder with nothing worth keeping is removed. The
exception then goes on as RunInterrupted or RunFailed, whose message is the one line to
print. On several ranks only rank 0 keeps, marks or removes the folder; the others drop
their unfinished trace. A part of profiling/harness.ProfiledRun."""

from core import run_folder
from core.errors import (
    RunFailed,
    RunInterrupted,
    UserError,
    interruption,
    is_write_failure,
    one_line,
)
from core.signals import ignore_stop_signals, stop_signal
from profiling import trace_writer
from profiling.profiler_setup import WRITER_CLOSE_S, close_within
from training import job_notes
from training.ranks import (
    launcher_gone,
    peer_cause,
    peer_line,
    stop_watching,
    the_users_stop,
)


class EarlyEnd:
    def end_early(self, exc: BaseException):
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
        # DDP's hook, torchrun's SIGTERM after another rank ended) is not the cause.
        gone = launcher_gone()
        users = None
        if not gone and self.ranks.distributed:
            if not interrupted:
                gone = peer_cause(exc, self.ranks.rank, self.ranks.world)
            elif job_notes.stopped_for_a_failure(str(exc)):
                gone = (peer_line(self.ranks.rank, self.ranks.world) or
                        "another rank failed; the launcher stopped this one")
            # That peer may have ended on the user's stop, met before this rank's own.
            users = gone and the_users_stop(self.ranks.rank, self.ranks.world)
        if users:
            interrupted, status, reason = True, "interrupted", users
        elif gone:
            interrupted, status, reason = False, "failed", gone
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
                trace_writer.remove_plain_traces(self.dir, self.ranks.worker_name())
                self.ranks.let_go(self.dir.name)
                raise (RunInterrupted if interrupted else RunFailed)(f"{reason} {at}") from exc
            if interrupted:  # every rank is alive and ending: none may be writing into
                self.ranks.wait_for_others(self.dir.name)  # the folder as it is renamed
        profiled = self.profiled_done()
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
            trace_writer.gzip_traces(self.dir, self.ranks.worker_name())
            self._drop_other_ranks_plain_traces()
            record = self.summary_of(status, profiled, reason=reason,
                                     completed_steps=self.done, planned_steps=self.total)
            self.write_files(record, exc if status == "failed" else None)
            marked = run_folder.mark(self.dir, status)
        except BaseException:  # noqa: BLE001 (nothing half-written is kept)
            return None
        return f"{run_folder.display(marked)} holds the {profiled} profiled steps that completed"

    def _drop_other_ranks_plain_traces(self) -> None:
        """Rank 0, keeping an early end's folder: the other ranks' plain traces go. Each
        drops its own as it ends early, but one that does so after rank 0 renamed the
        folder finds nothing, and its trace stayed unpacked in the -failed folder."""
        for rank in range(1, self.ranks.world):
            trace_writer.remove_plain_traces(self.dir, f"rank{rank}")

    def _keep_error_only(self, reason, exc) -> str | None:
        """A bug before any profiled step: its traceback, in a folder marked failed."""
        try:
            trace_writer.remove_plain_traces(self.dir, self.ranks.worker_name())
            self._drop_other_ranks_plain_traces()
            self.write_files({"status": "failed", "reason": reason,
                              "completed_steps": self.done, "planned_steps": self.total,
                              "config": self.plan.config}, exc)
            marked = run_folder.mark(self.dir, "failed")
        except BaseException:  # noqa: BLE001
            return None
        return f"traceback in {run_folder.display(marked / 'error.txt')}"
