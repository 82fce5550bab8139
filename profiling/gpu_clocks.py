"""The card's clocks, power and temperature over a run, from nvidia-smi beside it: what
the sustained rate ran at.

Why: over an epoch a card may hold its SM clock lower to stay under its power limit (or
to cool), and the step reader's events see only the slower steps; this says why, from
NVML's reasons. nvidia-smi samples from its own process: no kernel, no sync, no host time
in the run's. The calls and the energy counter's reads: docs/design.md, this module's
section."""

import csv
import os
import signal
import statistics
import subprocess
import time
from datetime import datetime
from pathlib import Path

from profiling import energy

SAMPLE_MS = 200
ENERGY_EVERY_S = 1.0  # the energy counter's reads, at most this often between the ends
FIELDS = ("timestamp", "clocks.sm", "clocks.mem", "power.draw", "power.limit",
          "temperature.gpu")
# The reasons' field was renamed in drivers of 2023 (nvidia-smi keeps the old name as an
# alias on most, but not every, build): the new name first.
REASON_FIELDS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
# nvmlClocksEventReasons bits: why the SM clock is below its maximum.
REASONS = {0x4: "the power cap", 0x8: "a hardware slowdown", 0x20: "software thermal",
           0x40: "hardware thermal", 0x80: "the power brake", 0x2: "application clocks",
           0x10: "sync boost", 0x1: "idle", 0x100: "the display clock"}
TIME_FORMAT = "%Y/%m/%d %H:%M:%S.%f"


def gpu_id(index: int) -> str:
    """nvidia-smi's name for torch's device `index`: its UUID, which holds whatever
    CUDA_VISIBLE_DEVICES renumbered."""
    import torch
    uuid = str(torch.cuda.get_device_properties(index).uuid)
    return uuid if uuid.startswith("GPU-") else f"GPU-{uuid}"


def _query(gpu: str, fields: tuple) -> list[str]:
    return ["nvidia-smi", f"--id={gpu}", f"--query-gpu={','.join(fields)}",
            "--format=csv,nounits"]


def _usable_fields(gpu: str) -> tuple[tuple | None, str | None]:
    """(the fields this nvidia-smi answers for this card, None) or (None, why not), from
    one query: a field it does not know fails the whole query."""
    why = None
    for reason in REASON_FIELDS:
        fields = (*FIELDS, reason)
        try:
            done = subprocess.run(_query(gpu, fields), capture_output=True, text=True,
                                  timeout=15)
        except (OSError, subprocess.SubprocessError) as exc:
            return None, f"nvidia-smi did not run ({exc})"
        if done.returncode == 0:
            return fields, None
        said = (done.stdout + done.stderr).strip().splitlines() or ["no output"]
        why = f"nvidia-smi refused the query ({said[-1]})"
    return None, why


# Runs the sampler ("$@") until told to stop or until the process that started it (the
# shell's parent, $PPID) is gone; `wait` (not a plain sleep) lets the trap act at once.
# Not preexec_fn: Python code between fork and exec may deadlock in a process with
# threads, as the training process is. The shell and the sampler share a session of their
# own (start_new_session, setsid in C), which stop() signals whole: a SIGTERM that came
# between "$@" & and the trap killed the shell alone, and nvidia-smi sampled on forever.
# The trap waits for the sampler, so that stop(), which waits for the shell, returns with
# the sampler reaped, not still dying.
WATCH = ('"$@" & s=$!; trap \'kill $s 2>/dev/null; wait $s; exit 0\' TERM INT; '
         'while kill -0 "$PPID" 2>/dev/null && kill -0 $s 2>/dev/null; do '
         'sleep 1 & wait $!; done; kill $s 2>/dev/null')


class Sampler:
    """nvidia-smi writing a CSV row every SAMPLE_MS into `path` until stop()."""

    def __init__(self, path: Path, process=None, unavailable: str | None = None,
                 meter=None):
        self.path, self.process, self.unavailable = path, process, unavailable
        self.since: datetime | None = None
        self.until: datetime | None = None
        self.meter = meter  # () -> millijoules, or None
        self.energy_at_mark: int | None = None  # the counter, millijoules
        self.energy_last: int | None = None     # at the last step's end read after the mark
        self.energy_steps = 0                   # the steps up to that read
        self.steps_since_mark = 0
        self.clock = time.monotonic
        self.energy_read_at = 0.0               # self.clock() at the last read

    @classmethod
    def start(cls, path: Path, gpu: str, open_meter=energy.open_meter) -> "Sampler":
        """Sampling card `gpu` (nvidia-smi's --id) into `path`; one whose summary says why
        not, where nvidia-smi cannot. Its energy counter beside, where NVML has one."""
        meter, _ = open_meter(gpu)
        fields, why = _usable_fields(gpu)
        if fields is None:
            return cls(path, unavailable=why, meter=meter)
        with path.open("w") as out:  # the child holds its own descriptor
            process = subprocess.Popen(["sh", "-c", WATCH, "sampler", *_query(gpu, fields),
                                        f"-lms={SAMPLE_MS}"],
                                       stdout=out, stderr=subprocess.DEVNULL,
                                       start_new_session=True)
        return cls(path, process, meter=meter)

    def mark(self) -> None:
        """The samples from now on are the summary's (the sustained steps')."""
        self.since = datetime.now()
        self.energy_at_mark, self.energy_steps = self._read_energy(), 0
        self.steps_since_mark, self.energy_read_at = 0, self.clock()

    def step_ended(self, last: bool = False) -> None:
        """A step is over (last: the run's last planned one): the samples after the last
        one (the trace's writing, the GPU idle) are not the steps'. The energy counter is
        read here once ENERGY_EVERY_S has gone by since its last read, and at the last
        step: the joules a step are those up to the latest read."""
        self.until = datetime.now()
        if self.energy_at_mark is None:
            return
        self.steps_since_mark += 1
        if last or self.clock() - self.energy_read_at >= ENERGY_EVERY_S:
            self.energy_last, self.energy_steps = self._read_energy(), self.steps_since_mark
            self.energy_read_at = self.clock()

    def _read_energy(self) -> int | None:
        # The host reads the counter as it queues the work: at the mark a step or two
        # ahead of the GPU (their joules counted in), at the last step's end no later
        # than the GPU (make throughput's window ends in a sync). At most two steps' joules
        # too many, over hundreds of sustained steps.
        if self.meter is None:
            return None
        try:
            return self.meter()
        except (RuntimeError, OSError):  # a counter that stops answering: no figure
            self.meter = self.energy_at_mark = None
            return None

    def _energy_summary(self) -> dict:
        if self.energy_at_mark is None or self.energy_last is None:
            return {}
        return {"joules_per_step": (self.energy_last - self.energy_at_mark) / 1e3
                / self.energy_steps, "energy_steps": self.energy_steps}

    def stop(self) -> dict:
        """Ends the sampling; the summary of the samples from mark() to the last
        step_ended() (from the first, to the last, without them)."""
        if self.process is None:
            return {"unavailable": self.unavailable, **self._energy_summary()}
        _end_group(self.process)
        self.process = None
        samples = [s for s in read_samples(self.path)
                   if (self.since is None or s["time"] >= self.since)
                   and (self.until is None or s["time"] <= self.until)]
        if not samples:
            return {"unavailable": "no sample in the sustained steps (a run too short for "
                    f"nvidia-smi's {SAMPLE_MS} ms)", "file": self.path.name,
                    **self._energy_summary()}
        return {**summarize(samples), "file": self.path.name, **self._energy_summary()}


def _end_group(process: subprocess.Popen) -> None:
    """SIGTERM to the shell's whole group (SIGKILL after 5 s), then the shell reaped. Sent
    before any poll(): until the shell is reaped its pid, the group's id, is not reused."""
    _signal_group(process.pid, signal.SIGTERM)
    try:
        process.wait(5)
    except subprocess.TimeoutExpired:
        _signal_group(process.pid, signal.SIGKILL)
        process.wait()


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:  # the shell and the sampler are gone
        pass


def read_samples(path: Path) -> list[dict]:
    """The CSV's rows as numbers; a row cut short by the sampler's end, or a field the
    card does not report ('[N/A]'), is left out."""
    samples = []
    with path.open(newline="") as f:
        for row in csv.reader(f):
            if len(row) != len(FIELDS) + 1:
                continue
            try:
                stamp = datetime.strptime(row[0].strip(), TIME_FORMAT)
                sm, mem, power, limit, temp = (float(v) for v in row[1:6])
                reasons = int(row[6].strip(), 16)
            except ValueError:
                continue  # the header, or an [N/A]
            samples.append({"time": stamp, "sm_mhz": sm, "mem_mhz": mem, "power_w": power,
                            "limit_w": limit, "temperature_c": temp, "reasons": reasons})
    return samples


def summarize(samples: list[dict]) -> dict:
    """Medians, the SM clock's range and its first and last tenth (the drift over the
    run), and the share of samples each reason held the clock down."""
    tenth = max(1, len(samples) // 10)
    sm = [s["sm_mhz"] for s in samples]
    held = {name: sum(bool(s["reasons"] & bit) for s in samples) / len(samples)
            for bit, name in REASONS.items()}
    return {"samples": len(samples), "every_ms": SAMPLE_MS,
            "sm_mhz_median": statistics.median(sm), "sm_mhz_min": min(sm),
            "sm_mhz_max": max(sm), "sm_mhz_first_tenth": statistics.median(sm[:tenth]),
            "sm_mhz_last_tenth": statistics.median(sm[-tenth:]),
            "mem_mhz_median": statistics.median(s["mem_mhz"] for s in samples),
            "power_w_median": statistics.median(s["power_w"] for s in samples),
            "power_limit_w": samples[-1]["limit_w"],
            "temperature_c_max": max(s["temperature_c"] for s in samples),
            "held_by": {name: round(share, 4) for name, share in held.items() if share}}


def held_under_load(clocks: dict) -> list[tuple[str, float]]:
    """(reason, share of samples) for each reason that held the clock down, most samples
    first; idle left out (no reason under load)."""
    return sorted(((name, share) for name, share in clocks["held_by"].items()
                   if name != "idle"), key=lambda kv: -kv[1])


def describe(clocks: dict | None) -> str | None:
    """The summary's line, or None where there is nothing to say (a CPU run)."""
    if not clocks:
        return None
    joules = (f"; {clocks['joules_per_step']:.2f} J a step over {clocks['energy_steps']} "
              "steps (NVML's energy counter)" if "joules_per_step" in clocks else "")
    if "unavailable" in clocks:
        return f"the GPU's clocks: not sampled ({clocks['unavailable']}){joules}"
    held = ", ".join(f"{name} {share * 100:.0f} %" for name, share in held_under_load(clocks))
    return (f"the GPU's clocks over those steps (nvidia-smi, {clocks['samples']} samples): "
            f"SM {clocks['sm_mhz_median']:.0f} MHz median ({clocks['sm_mhz_min']:.0f}–"
            f"{clocks['sm_mhz_max']:.0f}; first tenth {clocks['sm_mhz_first_tenth']:.0f}, "
            f"last {clocks['sm_mhz_last_tenth']:.0f}), memory {clocks['mem_mhz_median']:.0f} "
            f"MHz, {clocks['power_w_median']:.0f} W median of {clocks['power_limit_w']:.0f}, "
            f"{clocks['temperature_c_max']:.0f} °C at most; clock held down by: "
            f"{held or 'nothing'}{joules}")
