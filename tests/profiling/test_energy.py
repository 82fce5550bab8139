"""profiling/energy.py: NVML's energy counter through ctypes, and joules a call."""

import ctypes

import pytest

from profiling.energy import joules_per_call, open_meter


class FakeNVML:
    """libnvidia-ml's three calls: error codes as NVML returns them, the counter in mJ."""

    def __init__(self, init=0, handle=0, energy=0, mj=(1000, 4000)):
        self.codes, self.readings = (init, handle, energy), list(mj)

    def nvmlInit_v2(self):
        return self.codes[0]

    def nvmlDeviceGetHandleByUUID(self, uuid, handle):
        assert uuid == b"GPU-1234"
        return self.codes[1]

    def nvmlDeviceGetTotalEnergyConsumption(self, handle, out):
        ctypes.cast(out, ctypes.POINTER(ctypes.c_ulonglong)).contents.value = \
            self.readings.pop(0) if len(self.readings) > 1 else self.readings[0]
        return self.codes[2]


def test_the_meter_reads_the_counter_in_millijoules():
    meter, why = open_meter("GPU-1234", load=lambda name: FakeNVML(mj=(5, 7, 9)))
    assert why is None and meter() == 7 and meter() == 9  # the first read checked it


@pytest.mark.parametrize("nvml,message", [
    (FakeNVML(init=9), "NVML did not start (error 9)"),
    (FakeNVML(handle=13), "NVML has no GPU GPU-1234 (error 13)"),
    (FakeNVML(energy=3), "NVML's energy counter: error 3"),
])
def test_a_meter_that_cannot_read_says_why(nvml, message):
    assert open_meter("GPU-1234", load=lambda name: nvml) == (None, message)


def test_no_nvml_is_a_reason_not_a_crash():
    def missing(name):
        raise OSError(f"{name}: cannot open shared object file")
    meter, why = open_meter("GPU-1234", load=missing)
    assert meter is None and why.startswith("no NVML here (libnvidia-ml.so.1")


def test_joules_a_call_divide_the_window_by_its_calls():
    """A fake clock of 10 ms a call and a counter that gains 5 J over the window: about
    `seconds` of calls, 5 J / calls each, 5 J over the window's seconds as watts."""
    now, calls, energy = [0.0], [0], iter([100_000, 105_000])

    def fn():
        calls[0] += 1
        now[0] += 0.010

    joules, watts, ms = joules_per_call(lambda: next(energy), fn, seconds=1.0,
                                        sync=lambda: None, clock=lambda: now[0])
    timed = calls[0] - 3  # the three warm calls are not in the window
    assert timed == 100
    assert joules == pytest.approx(5.0 / timed) and ms == pytest.approx(10.0)
    assert watts == pytest.approx(5.0 / (timed * 0.010))


@pytest.mark.gpu
def test_the_gpus_counter_gives_the_watts_of_a_busy_gpu():
    import torch

    from profiling.gpu_clocks import gpu_id
    meter, why = open_meter(gpu_id(torch.cuda.current_device()))
    assert why is None, why
    from tests.helpers import gpu_counters_alone
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    with gpu_counters_alone():
        joules, watts, ms = joules_per_call(meter, lambda: a @ a, seconds=1.5)
    # A card of tens to hundreds of watts under GEMMs, at most its limit and some margin.
    assert 50 < watts < 1500 and joules == pytest.approx(watts * ms / 1e3, rel=0.05)
