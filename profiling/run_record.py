"""A run's record at its end: the trace summarized, the rates, FLOPs, clocks, memory and
compiles beside it, every rank's gathered on rank 0, and summary.json, the report page and
the table written. A part of profiling/harness.ProfiledRun, which holds the state it reads
(plan, dir, ranks, step_times, losses, the clocks' and memory's records)."""

import json
import time
import traceback

import torch

from core import run_folder
from core.errors import UserError
from core.files import write_whole
from profiling import (
    compile_account,
    flops,
    gpu_clocks,
    memory_account,
    memory_page,
    report_page,
    trace_writer,
)
from profiling.communication import communication
from profiling.environment import environment
from profiling.scaling import combine, format_ranks, scaling
from profiling.step_reader import data_wait, describe, pace, reader_lag, sustained, tail
from profiling.table import format_table
from profiling.trace_events import find_trace, load_trace
from profiling.trace_summary import not_measured_on_a_cpu, step_device_ms, summarize
from training import job_notes


class RunRecord:
    def write_files(self, summary: dict, exc: BaseException | None = None) -> None:
        """summary.json, and error.txt with the traceback of a bug (not of a user error)."""
        # Whole or not at all: a full disk must not leave a summary.json that looks
        # complete but is cut short.
        write_whole(self.dir / "summary.json", json.dumps(summary, indent=2) + "\n")
        report_page.write(self.dir, summary)  # a page to open, whatever the status
        if exc is not None and not isinstance(exc, UserError):
            write_whole(self.dir / "error.txt", "".join(traceback.format_exception(exc)))


    def summary_of(self, status: str, profiled: int | None = None, **extra) -> dict:
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
        first = self.first_sustained()
        rate = sustained(self.step_times, first, self.plan.batch_size * self.ranks.world)
        busy = self._busy_fraction(summary)
        wait = data_wait(self.step_times, first)
        lag = reader_lag(self.plan.mode, self.plan.run_ahead, self.cuda)
        slow = tail(self.step_times, first, lag)
        paced = pace(self.step_times, first)
        model_flops = self._model_flops(summary, rate, env["device"])
        table += "\n" + flops.describe(model_flops, "the step's device time", env["device"],
                                       self.plan.mode)
        first_ms = sum(t["host_ms"] for t in self.step_times[:self.plan.settle])
        compiled = compile_account.account(self.compiled_before, first_ms)
        if compiled:
            table += "\n" + compile_account.describe(compiled, self.plan.settle)
        if rate:
            loader = self.facts.get("batches", {}).get("loader_rate")
            table += "\n" + describe(rate, busy, wait, loader, self.plan.batch_size, slow,
                                      paced)
            clocks = gpu_clocks.describe(self.clocks_summary)
            if clocks:
                table += "\n" + clocks
        memory = self._memory_account(status)
        if memory:
            table += "\n" + memory_account.describe(memory)
        return {"status": status, **extra,
                "config": self.plan.config, "speedups": self.speedups,
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

    def first_sustained(self) -> int:
        """The first step of the sustained rate: the steps before it compile and tune. A
        CUDA graph is captured at the last --wait step: not a step of the steady state."""
        plan = self.plan
        return max(plan.settle, plan.wait) if "graph" in self.phases else plan.settle

    def _title(self, device: str) -> str:
        return f"{self.label}, {self.plan.mode} mode, batch {self.plan.batch_size}, {device}"

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
        plan = self.plan
        per_step = flops.step_flops(plan.batch_size, plan.image_size, plan.max_boxes,
                                    plan.hidden, plan.mode)
        gpu_s = step_device_ms(summary["step"]) / 1e3 if self.cuda else None
        account = flops.utilisation(per_step, gpu_s, device if self.cuda else None)
        if rate and self.cuda:
            step_s = plan.batch_size * self.ranks.world / rate["samples_per_s"]
            at_rate = flops.utilisation(per_step, step_s, device)
            account["sustained_tflop_per_s"] = at_rate["tflop_per_s"]
            account["sustained_mfu"] = at_rate["mfu"]
        return account

    def _busy_fraction(self, summary: dict) -> float | None:
        """The profiled steps' GPU busy time (the union of their kernels, copies and memsets
        over every stream, from the trace) over their time on the device (the step reader's events):
        how much of each step the GPU was kept busy. None without device times."""
        start = self.plan.wait + self.plan.warmup
        window = self.step_times[start:start + summary["steps"]]
        device = [t["device_ms"] for t in window if t["device_ms"] is not None]
        if not device or len(device) < len(window) or not self.cuda:
            return None
        return step_device_ms(summary["step"]) * len(device) / sum(device)

    def finish(self) -> None:
        self.say("writing the trace...")
        t0 = time.perf_counter()
        trace_writer.gzip_traces(self.dir, self.ranks.worker_name())
        record = self.summary_of("complete")
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
        self.write_files(record)
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
        job["ddp"] = self.plan.ddp
        job["distributed"]["parallel"] = self.plan.parallel
        if self.plan.scaling_baseline:
            job["distributed"]["scaling"] = scaling(job, self.plan.scaling_baseline)
        return job
