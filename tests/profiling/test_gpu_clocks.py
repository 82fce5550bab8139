"""profiling/gpu_clocks.py against a stand-in nvidia-smi on PATH (a Python script that
answers the query as the real one does, its SM clock falling row by row): the sampler's
rows, the window from mark() on, the reasons' bits, the older driver's field name, no
nvidia-smi at all, and no sampler left behind by a killed parent."""

import os
import subprocess
import sys
import textwrap
import time
from datetime import datetime

import pytest

from profiling import gpu_clocks
from profiling.gpu_clocks import Sampler, describe, read_samples, summarize

FAKE = textwrap.dedent('''\
    #!{python}
    import os, signal, sys, time
    from datetime import datetime
    if os.environ.get("FAKE_SMI_SLOW_EXIT"):  # a SIGTERM ends it 0.5 s later
        signal.signal(signal.SIGTERM, lambda *_: (time.sleep(0.5), os._exit(0)))
    if os.environ.get("FAKE_SMI_DEAF"):  # a SIGTERM does nothing
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    args = dict(a.split("=", 1) for a in sys.argv[1:] if "=" in a)
    fields = args["--query-gpu"].split(",")
    if os.environ.get("FAKE_SMI_OLD") and "clocks_event_reasons.active" in fields:
        print('Field "clocks_event_reasons.active" is not a valid field to query.')
        sys.exit(2)
    with open(os.environ["FAKE_SMI_LOG"], "a") as log:
        log.write(str(os.getpid()) + "\\n")
    print(", ".join(fields), flush=True)
    sm = 1980
    while True:
        print(f"{{datetime.now():%Y/%m/%d %H:%M:%S.%f}}"[:-3] +
              f", {{sm}}, 2619, 690.5, 700.00, 61, 0x0000000000000004", flush=True)
        sm -= 15
        if "-lms" not in args:
            break
        time.sleep(int(args["-lms"]) / 1000)
''')


@pytest.fixture
def fake_smi(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text(FAKE.format(python=sys.executable))
    script.chmod(0o755)
    log = tmp_path / "pids"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_SMI_LOG", str(log))
    monkeypatch.setattr(gpu_clocks, "SAMPLE_MS", 20)
    return log


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (exited, not yet reaped) counts as gone.
    with open(f"/proc/{pid}/stat") as f:
        return f.read().split(") ")[1][0] != "Z"


def test_the_samples_from_the_mark_on_and_their_summary(fake_smi, tmp_path):
    sampler = Sampler.start(tmp_path / "gpu_clocks.csv", "GPU-0")
    time.sleep(0.5)
    before_mark = datetime.now()
    sampler.mark()
    marked = datetime.now()
    time.sleep(0.6)
    before_end = datetime.now()
    sampler.step_ended()
    ended = datetime.now()
    time.sleep(0.3)  # the trace written, say: not the steps'
    clocks = sampler.stop()
    every = read_samples(tmp_path / "gpu_clocks.csv")
    # The window is the sampler's own marks: read from the test's clock after each call, a
    # sample taken between the call and that read was the sampler's and not the test's (a
    # CI on a loaded machine: 30 against 29).
    assert before_mark <= sampler.since <= marked and before_end <= sampler.until <= ended
    inside = [s for s in every if sampler.since <= s["time"] <= sampler.until]
    assert len(every) > clocks["samples"] == len(inside) >= 10
    assert clocks["sm_mhz_max"] == inside[0]["sm_mhz"] < every[0]["sm_mhz"]
    assert clocks["sm_mhz_min"] == inside[-1]["sm_mhz"] > every[-1]["sm_mhz"]
    assert clocks["sm_mhz_first_tenth"] > clocks["sm_mhz_median"] > clocks["sm_mhz_last_tenth"]
    assert clocks["power_w_median"] == 690.5 and clocks["power_limit_w"] == 700
    assert clocks["mem_mhz_median"] == 2619 and clocks["temperature_c_max"] == 61
    assert clocks["held_by"] == {"the power cap": 1.0}
    assert clocks["file"] == "gpu_clocks.csv"
    line = describe(clocks)
    assert "690 W median of 700" in line and "held down by: the power cap 100 %" in line
    pids = [int(p) for p in fake_smi.read_text().split()]
    assert not any(_alive(p) for p in pids)


def _counter(*readings, fail_at=None):
    """open_meter's stand-in: a meter giving these millijoules in turn (raising at the
    read numbered fail_at, as a counter that stops answering)."""
    calls = iter(range(len(readings)))

    def meter():
        i = next(calls)
        if i == fail_at:
            raise RuntimeError("NVML's energy counter: error 999")
        return readings[i]
    return lambda gpu: (meter, None)


def test_the_joules_a_step_from_the_mark_to_the_last_step(fake_smi, tmp_path):
    """The counter read at the mark and at the last step's end (a step ended before the
    mark is not read): 7.5 J over the three sustained steps, 2.5 J a step."""
    sampler = Sampler.start(tmp_path / "gpu_clocks.csv", "GPU-0",
                            open_meter=_counter(1000, 8500))
    sampler.step_ended()  # a warm-up step: before the mark
    time.sleep(0.2)
    sampler.mark()
    for step in range(3):
        time.sleep(0.1)
        sampler.step_ended(last=step == 2)
    clocks = sampler.stop()
    assert clocks["joules_per_step"] == pytest.approx(2.5) and clocks["energy_steps"] == 3
    assert "; 2.50 J a step over 3 steps (NVML's energy counter)" in describe(clocks)


def test_a_counter_that_stops_answering_gives_no_figure(fake_smi, tmp_path, monkeypatch):
    sampler = Sampler.start(tmp_path / "gpu_clocks.csv", "GPU-0",
                            open_meter=_counter(1000, 0, fail_at=1))
    sampler.mark()
    for step in range(3):
        sampler.step_ended(last=step == 2)
    time.sleep(0.2)
    assert "joules_per_step" not in sampler.stop()
    # Without nvidia-smi the counter still gives its figure.
    monkeypatch.setenv("PATH", str(tmp_path))
    sampler = Sampler.start(tmp_path / "none.csv", "GPU-0", open_meter=_counter(0, 4000))
    sampler.mark()
    sampler.step_ended(last=True)
    clocks = sampler.stop()
    assert clocks["joules_per_step"] == 4.0 and "not sampled" in describe(clocks)
    assert describe(clocks).endswith("; 4.00 J a step over 1 steps (NVML's energy counter)")


def test_the_counter_is_read_once_a_second_and_at_the_last_step(fake_smi, tmp_path):
    """Not at every step's end (a driver call that held the main thread for milliseconds):
    at the mark, once ENERGY_EVERY_S has gone by, and at the last step; the joules a step
    are those up to the latest read, over the steps up to it."""
    calls = []
    readings = iter((0, 1200, 1600))

    def meter():
        calls.append(now[0])
        return next(readings)
    now = [100.0]
    sampler = Sampler.start(tmp_path / "gpu_clocks.csv", "GPU-0",
                            open_meter=lambda gpu: (meter, None))
    sampler.clock = lambda: now[0]
    sampler.mark()
    for t in (100.1, 100.3, 100.5, 100.9, 101.2, 101.3):  # 101.2: a second after the mark
        now[0] = t
        sampler.step_ended()
    assert calls == [100.0, 101.2] and sampler.energy_steps == 5
    now[0] = 101.4
    sampler.step_ended(last=True)
    clocks = sampler.stop()
    assert calls == [100.0, 101.2, 101.4]
    assert clocks["energy_steps"] == 7 and clocks["joules_per_step"] == pytest.approx(1.6 / 7)


def test_an_older_driver_s_field_name(fake_smi, tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_SMI_OLD", "1")
    sampler = Sampler.start(tmp_path / "gpu_clocks.csv", "GPU-0")
    time.sleep(0.3)
    clocks = sampler.stop()
    assert clocks["samples"] >= 3 and clocks["held_by"] == {"the power cap": 1.0}


def test_no_nvidia_smi_says_why_and_the_run_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    sampler = Sampler.start(tmp_path / "gpu_clocks.csv", "GPU-0")
    clocks = sampler.stop()
    assert "nvidia-smi did not run" in clocks["unavailable"]
    assert describe(clocks).startswith("the GPU's clocks: not sampled (nvidia-smi did not run")
    assert describe(None) is None


def test_a_refused_query_says_nvidia_smi_s_own_line(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "nvidia-smi").write_text("#!/bin/sh\necho 'No devices were found'\nexit 6\n")
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    clocks = Sampler.start(tmp_path / "gpu_clocks.csv", "GPU-0").stop()
    assert clocks == {"unavailable": "nvidia-smi refused the query (No devices were found)"}


def _sampling_pid(log) -> int:
    """The sampler loop's pid, once the fake has logged two: the query that checks the
    fields, then the loop."""
    deadline = time.monotonic() + 20
    while not (log.exists() and len(log.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the sampler never started"
        time.sleep(0.05)
    return int(log.read_text().split()[-1])


def _gone_within(pid: int, seconds: float, why: str) -> None:
    deadline = time.monotonic() + seconds
    while _alive(pid):
        assert time.monotonic() < deadline, why
        time.sleep(0.05)


def test_a_killed_parent_leaves_no_sampler(fake_smi, tmp_path):
    parent = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from pathlib import Path; "
         "from profiling.gpu_clocks import Sampler; "
         "Sampler.start(Path(sys.argv[1]), 'GPU-0'); time.sleep(60)",
         str(tmp_path / "gpu_clocks.csv")],
        env={**os.environ, "PYTHONPATH": os.getcwd()})
    pid = _sampling_pid(fake_smi)
    parent.kill()
    parent.wait()
    _gone_within(pid, 10, "the sampler outlived its killed parent")


def test_stop_ends_the_sampler_whatever_its_shell_made_of_the_signal(fake_smi, tmp_path,
                                                                    monkeypatch):
    """A shell killed before its trap was set (a stop() right after start() on a loaded
    machine) once left nvidia-smi sampling for ever. Made certain here: a shell with no trap
    dies of the SIGTERM alone, and stop() must still end the sampler it started."""
    monkeypatch.setattr(gpu_clocks, "WATCH", '"$@" & wait')
    sampler = Sampler.start(tmp_path / "gpu_clocks.csv", "GPU-0")
    pid = _sampling_pid(fake_smi)
    sampler.stop()
    _gone_within(pid, 5, "nvidia-smi outlived stop()")


def test_stop_returns_with_the_sampler_gone_even_one_slow_to_exit(fake_smi, tmp_path,
                                                                  monkeypatch):
    """stop() waits for the shell, and the shell's trap for the sampler: a sampler that
    takes its time to exit is gone (reaped) when stop() returns. Before the trap waited,
    the shell left first and a CI found the fake still alive after stop()."""
    monkeypatch.setenv("FAKE_SMI_SLOW_EXIT", "1")
    sampler = Sampler.start(tmp_path / "gpu_clocks.csv", "GPU-0")
    pid = _sampling_pid(fake_smi)
    sampler.stop()
    assert not _alive(pid)


def test_a_sampler_deaf_to_sigterm_is_killed_after_the_bound(fake_smi, tmp_path,
                                                             monkeypatch):
    """The trap waits for the sampler; one that ignores SIGTERM would hold the shell for
    ever, so stop() kills the whole group once its 5 s are up."""
    monkeypatch.setenv("FAKE_SMI_DEAF", "1")
    sampler = Sampler.start(tmp_path / "gpu_clocks.csv", "GPU-0")
    pid = _sampling_pid(fake_smi)
    started = time.monotonic()
    sampler.stop()
    assert 5 <= time.monotonic() - started < 15
    _gone_within(pid, 5, "the deaf sampler outlived stop()'s SIGKILL")


def test_rows_cut_short_or_not_reported_are_left_out(tmp_path):
    path = tmp_path / "gpu_clocks.csv"
    path.write_text("timestamp, clocks.sm [MHz], ...\n"
                    "2026/11/26 20:00:00.100, 1980, 2619, 690.5, 700.00, 61, 0x0\n"
                    "2026/11/26 20:00:00.300, 1755, 2619, [N/A], 700.00, 62, 0x4\n"
                    "2026/11/26 20:00:00.500, 17\n")
    samples = read_samples(path)
    assert [s["sm_mhz"] for s in samples] == [1980]
    assert summarize(samples)["held_by"] == {}


@pytest.mark.gpu
def test_the_card_s_own_clocks_under_a_load(tmp_path):
    """On the device: the real nvidia-smi answers for torch's current GPU by its UUID, and
    a second of matrix products reads a clock, a power draw and a limit."""
    import torch
    sampler = Sampler.start(tmp_path / "gpu_clocks.csv",
                            gpu_clocks.gpu_id(torch.cuda.current_device()))
    a = torch.randn(4096, 4096, device="cuda", dtype=torch.bfloat16)
    sampler.mark()
    started = time.monotonic()
    while time.monotonic() - started < 1.5:
        for _ in range(20):
            a = (a @ a).clamp(-1, 1)
        torch.cuda.synchronize()  # host-device sync: the load is timed on the host
    sampler.step_ended()
    clocks = sampler.stop()
    assert "unavailable" not in clocks, clocks
    assert clocks["samples"] >= 4
    assert 500 < clocks["sm_mhz_median"] < 3000 and clocks["mem_mhz_median"] > 500
    assert 0 < clocks["power_w_median"] and 100 < clocks["power_limit_w"] < 2000
    assert 0 < clocks["temperature_c_max"] < 110
    # NVML's counter over the one "step": the watts of a card under GEMMs.
    assert 50 < clocks["joules_per_step"] / (time.monotonic() - started) < 1500
