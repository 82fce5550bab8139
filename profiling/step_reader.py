"""Each step's loss and device time, read --run-ahead steps later, so that the train step
needs no host-device sync: the loss is copied into pinned memory behind the step and an
event recorded; the host waits on that event, never on the device.
Its design in full: docs/design.md."""

import time
from collections import deque
from dataclasses import dataclass

import torch

from core.waits import wait_for


@dataclass
class StepRead:
    step: int
    loss: float
    host_ms: float             # the host's time from the step's start to its end
    device_ms: float | None    # the stream's time from the previous step's end to this one's
    data_ms: float = 0.0       # the host's time waiting for the loader within the step
    # The whole loop's time for the step, less its waits for the GPU: host_ms plus what
    # follows the step's hand-over (this reader's bookkeeping, the profiler's step, the
    # clocks' read). None where the step was read before its loop ended (lag 0).
    loop_ms: float | None = None


class StepReader:
    def __init__(self, cuda: bool, lag: int = 1):
        self.cuda = cuda
        self.lag = lag
        # (step, loss or its pinned slot, event, the step before's event, host ms, data ms),
        # oldest first
        self._pending: deque = deque()
        self._last_event: torch.cuda.Event | None = None
        self._slots: list[torch.Tensor] = []
        self._waited_s = 0.0           # the host's time blocked on step-end events, in all
        self._waited_at_put = 0.0      # ... when the last step was put
        self._loop_ms: dict[int, float] = {}  # loop_ended's figures, until their step is read

    def put(self, step: int, loss: torch.Tensor, started: float, data_ms: float = 0.0) -> None:
        """The step's loss, enqueued for reading; started: its time.perf_counter() start;
        data_ms: how long it waited for the loader."""
        host_ms = (time.perf_counter() - started) * 1e3
        self._waited_at_put = self._waited_s
        if not self.cuda:
            self._pending.append((step, loss.detach(), None, None, host_ms, data_ms))
            return
        # A ring of lag + 2 pinned slots: a slot is written again only after it was read.
        if not self._slots:
            self._slots = [torch.empty((), dtype=torch.float32, pin_memory=True)
                           for _ in range(self.lag + 2)]
        slot = self._slots[step % len(self._slots)]
        slot.copy_(loss.detach(), non_blocking=True)  # no sync: behind the step's work
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        self._pending.append((step, slot, event, self._last_event, host_ms, data_ms))
        self._last_event = event

    def loop_ended(self, step: int, started: float) -> None:
        """The loop that put `step` has done its work (started: the same start as put's):
        its time since then, less what it waited for the GPU in ready(), is the step's
        loop_ms, handed over with the step's read."""
        if not any(pending[0] == step for pending in self._pending):
            return  # read already (lag 0): its read went out without it
        waited = self._waited_s - self._waited_at_put
        self._loop_ms[step] = ((time.perf_counter() - started) - waited) * 1e3

    def ready(self) -> list[StepRead]:
        """The steps at least `lag` steps old, read (waiting for their events if the GPU
        has not got there yet)."""
        reads = []
        while len(self._pending) > self.lag:
            reads.append(self._read(self._pending.popleft()))
        return reads

    def drain(self) -> list[StepRead]:
        """Every step not read yet (the run's end)."""
        reads = [self._read(p) for p in self._pending]
        self._pending.clear()
        return reads

    def _read(self, pending) -> StepRead:
        step, value, event, previous, host_ms, data_ms = pending
        device_ms = None
        if event is not None:
            started = time.perf_counter()
            wait_for(event)  # this step's end on the stream, not the device; a signal ends it
            self._waited_s += time.perf_counter() - started
            if previous is not None:
                device_ms = previous.elapsed_time(event)
        return StepRead(step, float(value), host_ms, device_ms, data_ms,
                        self._loop_ms.pop(step, None))


def sustained(step_times: list[dict], first: int, samples_per_step: int) -> dict | None:
    """The rate the run sustained over its steps from `first` on (the steps before it
    compile, tune and capture): samples per second over the summed step times, and the
    median and 95th percentile step, by the device's clock where there is one (CUDA
    events at step boundaries), else the host's. None without such steps."""
    timed = step_times[first:]
    key = _timer(timed)
    # A run's first step has no step before it to time from on the device.
    times = sorted(t[key] for t in timed if t[key] is not None)
    if not times or sum(times) <= 0:
        return None
    median, p95 = _median_p95(times)
    return {"timer": "device (CUDA events at step boundaries)" if key == "device_ms"
            else "host wall",
            "steps": len(times), "samples_per_s": samples_per_step * len(times) / sum(times) * 1e3,
            "step_ms_median": median, "step_ms_p95": p95}


def _timer(timed: list[dict]) -> str:
    """The step time sustained() and tail() read: the device's where any step has one
    (CUDA events), else the host's."""
    return "device_ms" if any(t["device_ms"] is not None for t in timed) else "host_ms"


def _median_p95(ordered: list[float]) -> tuple[float, float]:
    """The median and 95th percentile of values sorted in ascending order (not empty)."""
    last = len(ordered) - 1
    return ordered[len(ordered) // 2], ordered[min(last, round(0.95 * last))]


def reader_lag(mode: str, run_ahead: int, cuda: bool) -> int:
    """How many steps late train.py reads each loss: --run-ahead in train mode on a GPU;
    0 in forward mode (its ranges each end in a sync) and on a CPU (no stream to run
    ahead of)."""
    return run_ahead if mode == "train" and cuda else 0


SLOWEST = 0.01  # the share of the steps tail() names


def tail(step_times: list[dict], first: int, lag: int) -> dict | None:
    """Where the mean step's excess over the median comes from (the sustained rate is the
    mean's): the slowest 1 % of the steps from `first` on, by the timer sustained() uses,
    what they add to the mean over the median, and the longest data wait and host step in
    the lag + 1 steps up to each of them (the host runs up to `lag` steps ahead, so its
    lateness idles the GPU in that step or the ones after), and where they fall: their
    step numbers and how many lie in the first tenth of the steps (a warm-up's residue,
    a compile or a loader still filling, against a tail spread over the run). None
    without such steps."""
    timed = step_times[first:]
    key = _timer(timed)
    steps = [i for i, t in enumerate(timed) if t[key] is not None]
    if not steps:
        return None
    order = sorted(steps, key=lambda i: timed[i][key])  # fastest first, sorted once
    times = [timed[i][key] for i in order]
    median, _ = _median_p95(times)
    slow = order[-max(1, round(len(steps) * SLOWEST)):]
    before = [t for i in slow for t in timed[max(0, i - lag):i + 1]]
    tenth = steps[0] + (steps[-1] - steps[0] + 1) / 10  # the window's first tenth ends here
    return {"steps": len(steps), "mean_ms": sum(times) / len(times),
            "median_ms": median, "slowest": len(slow),
            "slowest_ms": (timed[slow[0]][key], timed[slow[-1]][key]),
            "slowest_add_ms": sum(timed[i][key] - median for i in slow) / len(steps),
            "data_wait_max_ms": max(t.get("data_ms", 0.0) for t in before),
            "host_max_ms": max(t["host_ms"] for t in before), "lag": lag,
            # Numbered from 1, as the progress lines number the steps.
            "slowest_at": sorted(first + i + 1 for i in slow),
            "window": (first + steps[0] + 1, first + steps[-1] + 1),
            "in_first_tenth": sum(i < tenth for i in slow)}


SLOW = 1.3  # a step this many times the median is a slow one (pace())


def pace(step_times: list[dict], first: int) -> dict | None:
    """Whether the host keeps ahead of the GPU over the steps from `first` on: the host's
    time a step (median, p90, p99: its work to enqueue a step, data waits included), its
    median against the median step (sustained()'s timer), and how many steps after the
    window's first tenth took over SLOW times the median step (a host that needs most of
    the step leaves no slack, and any hiccup then idles the GPU). None without steps."""
    timed = step_times[first:]
    key = _timer(timed)
    steps = [t for t in timed if t[key] is not None]
    if not steps:
        return None
    host = sorted(t["host_ms"] for t in steps)
    step = sorted(t[key] for t in steps)
    median = step[len(step) // 2]
    late = [t[key] for t in steps[len(steps) // 10:]]
    slow = sum(ms > SLOW * median for ms in late)
    host_median = _at(host, 0.5)
    loop = sorted(t["loop_ms"] for t in steps if t.get("loop_ms") is not None)
    loop_median = _at(loop, 0.5) if loop else None
    return {"steps": len(steps), "host_ms_median": host_median,
            "host_ms_p90": _at(host, 0.9), "host_ms_p99": _at(host, 0.99),
            "step_ms_median": median, "host_share": host_median / median if median else None,
            "loop_ms_median": loop_median, "loop_ms_p90": _at(loop, 0.9) if loop else None,
            "loop_share": loop_median / median if loop and median else None,
            "after_first_tenth": len(late), "slow_steps": slow,
            "slow_share": slow / len(late) if late else 0.0}


def _at(ordered: list[float], q: float) -> float:
    """The q-quantile of values sorted in ascending order (not empty), nearest rank."""
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


WAITED_MS = 1.0  # a step whose data phase took longer waited for the loader


def data_wait(step_times: list[dict], first: int) -> dict | None:
    """How long the steps from `first` on waited for the loader (host time in the data
    phase): in all, the median and 95th percentile step, and how many steps waited over
    WAITED_MS. None without such steps."""
    waits = sorted(t.get("data_ms", 0.0) for t in step_times[first:])
    if not waits:
        return None
    median, p95 = _median_p95(waits)
    return {"steps": len(waits), "total_ms": round(sum(waits), 3),
            "median_ms": round(median, 4), "p95_ms": round(p95, 4),
            "steps_waited": sum(w > WAITED_MS for w in waits)}


def describe(rate: dict, busy_fraction: float | None, wait: dict | None = None,
             loader: dict | None = None, batch: int = 0, slow: dict | None = None,
             paced: dict | None = None) -> str:
    """The lines under a run's table. loader: the loader's own rate (data/loader.own_rate);
    batch: samples per batch of one process's loader; slow: tail()'s account; paced:
    pace()'s."""
    line = (f"sustained: {rate['samples_per_s']:,.0f} samples/s over {rate['steps']} steps "
            f"({rate['timer']}; step median {rate['step_ms_median']:.2f} ms, p95 "
            f"{rate['step_ms_p95']:.2f} ms)")
    if busy_fraction is not None:
        line += (f"; the GPU busy {busy_fraction * 100:.0f} % of its "
                 "profiled steps")
    if wait:
        line += (f"\ndata wait (host): {wait['total_ms']:,.1f} ms over those steps, median "
                 f"{wait['median_ms']:.2f} ms, p95 {wait['p95_ms']:.2f} ms; "
                 f"{_count(wait['steps_waited'], 'step')} waited over {WAITED_MS:g} ms")
    if slow:
        line += "\n" + describe_tail(slow)
    if paced:
        line += "\n" + describe_pace(paced)
    if loader:
        who = (f"the loader's {_count(loader['workers'], 'worker')}" if loader['workers']
               else "the loader (no workers: the main process)")
        line += (f"\n{who}: {loader['batches_per_s']:.1f} "
                 f"batches/s ({loader['batches_per_s'] * batch / 1e3:.1f} k samples/s), "
                 f"{loader['worker_batch_ms']:.0f} ms a batch in a worker")
    return line


def describe_tail(slow: dict) -> str:
    """tail()'s line: 'the tail: the sustained steps' mean is 20.25 ms, their median 20.00;
    the slowest 2 (30.0–60.0 ms; steps 42 and 152 of 2–201, none in the first tenth) add
    0.25 ms to the mean; in the 2 steps before each, the host took up to 95.0 ms a step
    and waited up to 90.0 ms for data'. The mean is the sustained steps', not the table's
    profiled window's."""
    low, high = slow["slowest_ms"]
    span = f"{high:.1f}" if low == high else f"{low:.1f}–{high:.1f}"
    at, (begin, end) = slow["slowest_at"], slow["window"]
    where = (f"step {at[0]}" if len(at) == 1 else f"steps {at[0]} and {at[1]}" if len(at) == 2
             else f"steps {at[0]}–{at[-1]}")
    early = slow["in_first_tenth"] or "none"
    before = f"in the {_count(slow['lag'], 'step')} before each" if slow["lag"] else "in each"
    return (f"the tail: the sustained steps' mean is {slow['mean_ms']:.2f} ms, their median "
            f"{slow['median_ms']:.2f}; the slowest {_count(slow['slowest'], 'step')} ({span} "
            f"ms; {where} of {begin}–{end}, {early} in the first tenth) "
            f"add{'s' if slow['slowest'] == 1 else ''} {slow['slowest_add_ms']:.2f} ms to the "
            f"mean; {before}, the host took up to {slow['host_max_ms']:.1f} ms a step and "
            f"waited up to {slow['data_wait_max_ms']:.1f} ms for data")


def describe_pace(paced: dict) -> str:
    """pace()'s line: the host's time a step against the step's, and the slow steps."""
    share = paced["host_share"]
    of = f", {share * 100:.0f} % of the median step" if share is not None else ""
    loop = paced.get("loop_ms_median")
    whole = "" if loop is None else (
        f"; the whole loop {loop:.1f} ms a step (median; p90 {paced['loop_ms_p90']:.1f}: the "
        "bookkeeping after the step added, the waits for the GPU left out)"
        + (f", {paced['loop_share'] * 100:.0f} % of the median step"
           if paced.get("loop_share") else ""))
    return (f"the host: {paced['host_ms_median']:.1f} ms a step (median; p90 "
            f"{paced['host_ms_p90']:.1f}, p99 {paced['host_ms_p99']:.1f}){of}{whole}; "
            f"{paced['slow_steps']} of the {paced['after_first_tenth']} steps after the "
            f"first tenth over {SLOW:g}x the median step "
            f"({paced['slow_share'] * 100:.1f} %)")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")
