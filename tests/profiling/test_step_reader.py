"""The step reader: a step's loss read a step later gives the losses of a read at every
step's end, a NaN still ends the run within a step, the sustained rate is the samples over
the summed step times; on a GPU a train step then runs without a host-device sync."""

import pytest
import torch

import losses
import train
from core.errors import RunFailed, UserError
from data import SyntheticFaces
from data.loader import make_loader
from profiling import step_reader
from profiling.step_reader import StepReader, sustained
from tests.helpers import SMALL, TINY, make_every_loss_nan, resolved
from training import speedups
from training.feed import CopyAhead


def test_a_lagged_read_gives_each_loss_once_in_order():
    values = [0.5, 0.25, float("nan"), 2.0]
    for lag in (0, 1, 2):
        reader, seen = StepReader(cuda=False, lag=lag), []
        for step, v in enumerate(values):
            reader.put(step, torch.tensor(v), 0.0)
            ready = reader.ready()
            assert [r.step for r in ready] == ([step - lag] if step >= lag else [])
            seen += ready
        seen += reader.drain()
        assert [r.step for r in seen] == [0, 1, 2, 3]
        assert [r.loss for r in seen][:2] == values[:2] and seen[3].loss == values[3]
        assert all(r.device_ms is None for r in seen)  # no device on a CPU


class _Clock:
    """time.perf_counter for the step reader, moved by hand (seconds)."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


class _Event:
    def elapsed_time(self, other):
        return 20.0


def test_the_loops_time_adds_what_follows_the_step_and_leaves_out_the_gpu_waits(monkeypatch):
    """A step of 6 ms handed over, then 4 ms of waiting for the GPU two steps back inside
    ready(), then 1 ms of bookkeeping: its loop took 7 ms of the host's work. A read made
    before its loop ended (lag 0) goes out without the figure, and nothing is kept."""
    clock = _Clock()
    monkeypatch.setattr(step_reader.time, "perf_counter", clock)
    monkeypatch.setattr(step_reader, "wait_for", lambda event: setattr(
        clock, "now", clock.now + 0.004))
    reader = StepReader(cuda=False, lag=1)
    reads = []
    for step in range(3):
        started = clock.now
        clock.now += 0.006
        reader.put(step, torch.tensor(1.0), started)
        # As on a GPU: each step's read waits on its event (a stand-in here).
        reader._pending[-1] = (*reader._pending[-1][:2], _Event(), _Event(),
                               *reader._pending[-1][4:])
        reads += reader.ready()
        clock.now += 0.001
        reader.loop_ended(step, started)
    reads += reader.drain()
    assert [r.step for r in reads] == [0, 1, 2]
    assert [r.host_ms for r in reads] == pytest.approx([6.0, 6.0, 6.0])
    # Step 0's loop waited for nothing (no step was two back); steps 1 and 2 waited 4 ms.
    assert [r.loop_ms for r in reads] == pytest.approx([7.0, 7.0, 7.0])
    now = StepReader(cuda=False, lag=0)
    now.put(0, torch.tensor(1.0), clock.now)
    (read,) = now.ready()
    now.loop_ended(0, clock.now)
    assert read.loop_ms is None and not now._loop_ms


def test_the_pace_gives_the_loops_time_beside_the_steps():
    times = [{"host_ms": 8.0, "device_ms": 20.0, "loop_ms": 9.0 + (i % 3)} for i in range(30)]
    paced = step_reader.pace(times, first=0)
    assert (paced["loop_ms_median"], paced["loop_ms_p90"]) == (10.0, 11.0)
    assert paced["loop_share"] == pytest.approx(0.5)
    assert ("; the whole loop 10.0 ms a step (median; p90 11.0: the bookkeeping after the "
            "step added, the waits for the GPU left out), 50 % of the median step; ") in \
        step_reader.describe_pace(paced)
    without = step_reader.pace([{"host_ms": 8.0, "device_ms": 20.0}] * 3, first=0)
    assert without["loop_ms_median"] is None and "whole loop" not in \
        step_reader.describe_pace(without)


def _force_lag(monkeypatch, forced: int):
    """train.run's step reader with this lag (on a CPU it reads at once otherwise)."""
    real = StepReader.__init__

    def init(self, cuda, lag=0):
        real(self, cuda, lag=forced)
    monkeypatch.setattr(StepReader, "__init__", init)


@pytest.mark.parametrize("lag", [1, 2])
def test_a_run_reading_its_losses_steps_late_gets_the_same_losses(tmp_path, monkeypatch, lag):
    args = TINY + ["--out-dir", str(tmp_path), "--active", "4"]
    now = train.run(train.parse_config(args))["losses"]
    _force_lag(monkeypatch, lag)
    late = train.run(train.parse_config(args))["losses"]
    assert late == now and len(now) == 5


def test_a_run_a_step_ahead_records_each_loops_time(tmp_path, monkeypatch):
    """Read a step late, every step has its loop's time, at least the step's own (no GPU
    to wait for here), and the run's lines give it; read at once (a CPU's default), none."""
    args = TINY + ["--out-dir", str(tmp_path), "--active", "4"]
    now = train.run(train.parse_config(args))
    assert all(t["loop_ms"] is None for t in now["step_times"])
    assert "whole loop" not in now["table"]
    _force_lag(monkeypatch, 1)
    late = train.run(train.parse_config(args))
    assert all(t["loop_ms"] >= t["host_ms"] for t in late["step_times"])
    assert late["pace"]["loop_ms_median"] > 0 and "the whole loop " in late["table"]


def test_the_host_runs_at_least_a_step_ahead():
    with pytest.raises(UserError, match="--run-ahead 0: the host runs at least a step ahead"):
        train.validate(train.parse_config(TINY + ["--run-ahead", "0"]))
    assert train.parse_config([]).run_ahead == 2


def test_a_nan_read_a_step_late_still_ends_the_run(tmp_path, monkeypatch):
    _force_lag(monkeypatch, 1)
    make_every_loss_nan(monkeypatch)
    with pytest.raises(RunFailed, match="run failed at step 2 of 3: the loss is nan at step 1"):
        train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path)]))


def test_the_sustained_rate_is_samples_over_the_summed_step_times():
    times = [{"host_ms": 900.0, "device_ms": None}] + [
        {"host_ms": 5.0, "device_ms": ms} for ms in (10.0, 20.0, 10.0, 40.0)]
    rate = sustained(times, first=1, samples_per_step=100)
    assert rate["timer"].startswith("device") and rate["steps"] == 4
    assert rate["samples_per_s"] == pytest.approx(400 / 80e-3)
    assert (rate["step_ms_median"], rate["step_ms_p95"]) == (20.0, 40.0)
    # The first step has no device time: it is left out, not read as zero.
    assert sustained(times, first=0, samples_per_step=100) == rate
    host = sustained([{"host_ms": 4.0, "device_ms": None}] * 3, 0, 8)
    assert host["timer"] == "host wall" and host["samples_per_s"] == pytest.approx(2000)
    assert sustained(times, first=5, samples_per_step=100) is None
    assert "busy 50 %" in step_reader.describe(rate, 0.5)


def test_the_data_wait_is_counted_over_the_steps_after_the_first():
    times = [{"host_ms": 1.0, "device_ms": None, "data_ms": ms}
             for ms in (500.0, 0.1, 0.2, 3.0, 0.1, 12.0)]
    wait = step_reader.data_wait(times, first=1)
    assert wait["steps"] == 5 and wait["total_ms"] == pytest.approx(15.4)
    assert (wait["median_ms"], wait["p95_ms"], wait["steps_waited"]) == (0.2, 12.0, 2)
    assert step_reader.data_wait(times, first=6) is None
    line = step_reader.describe(sustained(times, 1, 8), None, wait,
                                {"workers": 2, "batches_per_s": 50.0, "worker_batch_ms": 40.0},
                                batch=8)
    assert "2 steps waited over 1 ms" in line and "50.0 batches/s (0.4 k samples/s)" in line


def test_the_tail_names_the_slowest_steps_and_the_host_before_them():
    """200 device steps of 20 ms but two: step 150 of 60 ms after a 90 ms data wait two
    steps before it, step 40 of 30 ms with nothing before it on the host."""
    times = [{"host_ms": 900.0, "device_ms": None, "data_ms": 0.0}] + [
        {"host_ms": 20.0, "device_ms": 20.0, "data_ms": 0.5} for _ in range(200)]
    times[1 + 148].update(data_ms=90.0, host_ms=95.0)
    times[1 + 150]["device_ms"] = 60.0
    times[1 + 40]["device_ms"] = 30.0
    slow = step_reader.tail(times, first=1, lag=2)
    assert (slow["steps"], slow["slowest"], slow["lag"]) == (200, 2, 2)
    assert slow["median_ms"] == 20.0 and slow["mean_ms"] == pytest.approx(20.25)
    assert slow["slowest_ms"] == (30.0, 60.0)
    assert slow["slowest_add_ms"] == pytest.approx((10.0 + 40.0) / 200)
    assert (slow["data_wait_max_ms"], slow["host_max_ms"]) == (90.0, 95.0)
    # Where they fall, numbered from 1 as the progress lines number the steps: steps 42
    # and 152 of the window 2-201 (the first step is not sustained), neither in its first
    # tenth.
    assert (slow["slowest_at"], slow["window"], slow["in_first_tenth"]) == \
        ([42, 152], (2, 201), 0)
    # One step back only: the wait two steps before step 150 is out of the window.
    near = step_reader.tail(times, first=1, lag=1)
    assert (near["data_wait_max_ms"], near["host_max_ms"]) == (0.5, 20.0)
    line = step_reader.describe(sustained(times, 1, 8), None, slow=slow)
    assert ("the tail: the sustained steps' mean is 20.25 ms, their median 20.00; the "
            "slowest 2 steps (30.0–60.0 ms; steps 42 and 152 of 2–201, none in the first "
            "tenth) add 0.25 ms to the mean; in the 2 steps before each, the host took up "
            "to 95.0 ms a step and waited up to 90.0 ms for data") in line
    # A slow step in the first tenth of the window (step 13 of 2-201) is counted there.
    times[1 + 11]["device_ms"] = 70.0
    early = step_reader.tail(times, first=1, lag=2)
    assert (early["slowest_at"], early["in_first_tenth"]) == ([13, 152], 1)
    # On a CPU the host's clock times the steps, none ahead.
    host = step_reader.tail([{"host_ms": ms, "device_ms": None} for ms in (5.0, 5.0, 9.0)],
                            first=0, lag=0)
    assert host["slowest_ms"] == (9.0, 9.0) and host["data_wait_max_ms"] == 0.0
    assert host["slowest_at"] == [3] and host["window"] == (1, 3)
    assert ("(9.0 ms; step 3 of 1–3, none in the first tenth) adds 1.33 ms to the mean; "
            "in each, the host took up to 9.0 ms a step") in step_reader.describe(
        sustained([{"host_ms": 5.0, "device_ms": None}] * 3, 0, 1), None, slow=host)
    assert step_reader.tail(times, first=201, lag=2) is None


def test_the_pace_sets_the_hosts_step_against_the_gpus_and_counts_the_slow_steps():
    """400 device steps of 20 ms with the host at 8-12 ms: three steps over 1.3x the median
    (26 ms), one of them in the first tenth (not counted), one at exactly 26 ms (not over);
    the host's median, p90 and p99 by nearest rank."""
    times = [{"host_ms": 900.0, "device_ms": None}] + [
        {"host_ms": 8.0 + (i % 5), "device_ms": 20.0} for i in range(400)]
    times[1 + 10]["device_ms"] = 40.0  # the first tenth: 40 of the 400
    times[1 + 100]["device_ms"] = 26.0
    times[1 + 200]["device_ms"] = 27.0
    times[1 + 300].update(device_ms=50.0, host_ms=45.0)
    paced = step_reader.pace(times, first=1)
    assert (paced["steps"], paced["after_first_tenth"], paced["slow_steps"]) == (400, 360, 2)
    assert paced["step_ms_median"] == 20.0 and paced["host_ms_median"] == 10.0
    assert (paced["host_ms_p90"], paced["host_ms_p99"]) == (12.0, 12.0)
    assert paced["host_share"] == pytest.approx(0.5)
    assert paced["slow_share"] == pytest.approx(2 / 360)
    assert step_reader.describe_pace(paced) == (
        "the host: 10.0 ms a step (median; p90 12.0, p99 12.0), 50 % of the median step; 2 "
        "of the 360 steps after the first tenth over 1.3x the median step (0.6 %)")
    # On a CPU the host's clock times the steps: the host is the whole step.
    host = step_reader.pace([{"host_ms": ms, "device_ms": None} for ms in (5.0, 5.0, 9.0)], 0)
    assert host["host_share"] == 1.0 and host["slow_steps"] == 1
    assert step_reader.pace(times, first=401) is None


def test_a_cpu_runs_tail_is_in_its_summary_and_its_lines(tmp_path):
    summary = train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path)]))
    assert summary["tail"]["lag"] == 0 and summary["tail"]["steps"] >= 1
    assert "the tail: the sustained steps' mean is " in summary["table"]
    assert summary["pace"]["steps"] == summary["tail"]["steps"]
    assert "the host: " in summary["table"] and "over 1.3x the median step" in summary["table"]


@pytest.mark.gpu
@pytest.mark.parametrize("loss,backend", [("padded", "triton"), ("compiled", "triton"),
                                          ("kernel", "triton"), ("kernel", "cuda"),
                                          ("conditional", "cuda")])
def test_a_train_step_has_no_host_device_sync(loss, backend):
    """As train.py runs it: the ring loader's pinned batches, each copied a step ahead on
    a side stream (training/feed.py), the loss read a step late."""
    cfg = train.parse_config(SMALL + ["--loss", loss, "--backend", backend])
    strategy = losses.get(loss, backend=backend, capacity=cfg.max_boxes)
    device = torch.device("cuda")
    used = resolved(cfg, True)["on"]
    speedups.set_process_flags(used, True, many_runs=False)
    _, runner, optimizer = speedups.build(used, device, False, train.model_sizes(cfg),
                                          cfg.amp, cfg.lr)
    fns = train.make_step(cfg, strategy, runner, optimizer, device)
    loader = make_loader(SyntheticFaces(10 * cfg.batch_size, cfg.image_size, cfg.seed),
                         cfg.batch_size, 0, strategy.collate, pin_memory=True, ring=True)
    feed = CopyAhead(loader, fns.copy, fns.arrive)
    reader = StepReader(cuda=True, lag=1)

    def step(i):
        reader.put(i, fns.train_step(*feed.take()), 0.0)
        feed.prepare()

    for i in range(2):  # compile, autotune, load kernels: outside the check
        step(i)
    torch.cuda.synchronize()  # host-device sync: before the check starts
    # The next batches' generation on the host happens inside the check too (no workers):
    # the loader's own work must not sync either.
    torch.cuda.set_sync_debug_mode("error")
    try:
        for i in range(2, 6):
            step(i)
    finally:
        torch.cuda.set_sync_debug_mode("default")
    reads = reader.drain()
    assert [r.step for r in reads] == [0, 1, 2, 3, 4, 5]
    assert all(torch.isfinite(torch.tensor(r.loss)) for r in reads)
    assert all(r.device_ms > 0 for r in reads[1:])


@pytest.mark.gpu
def test_the_host_runs_run_ahead_steps_ahead_with_the_same_losses(tmp_path, monkeypatch):
    """train.py's reader reads each loss --run-ahead steps late on a GPU (the host may
    enqueue that many steps beyond the GPU), and the losses are the same."""
    lags, real = [], StepReader.__init__

    def init(self, cuda, lag=0):
        lags.append(lag)
        real(self, cuda, lag=lag)
    monkeypatch.setattr(StepReader, "__init__", init)
    losses_of = {}
    for ahead in (1, 3):
        args = SMALL + ["--out-dir", str(tmp_path / str(ahead)), "--active", "4",
                        "--run-ahead", str(ahead)]
        losses_of[ahead] = train.run(train.parse_config(args))["losses"]
    assert lags == [1, 3]
    assert losses_of[1] == losses_of[3] and len(losses_of[1]) == 6
