"""A GPU's energy counter: NVML's total energy since the driver loaded, read through ctypes
from the driver's own libnvidia-ml.so.1. At the card's power cap a step's time is its
energy over the power the cap allows, so joules say what to make cheaper. The counter
moves every 20-100 ms, so joules_per_call runs a function back to back for a second or
more. The design in full: docs/design.md, this module's section."""

import ctypes
import math
import time

NVML = "libnvidia-ml.so.1"


def open_meter(gpu: str, load=ctypes.CDLL):
    """(meter, None), meter() -> millijoules so far, for the GPU of that NVML UUID
    ("GPU-..."); or (None, why) where NVML or its counter is not there."""
    try:
        nvml = load(NVML)
    except OSError as e:
        return None, f"no NVML here ({e})"
    code = nvml.nvmlInit_v2()
    if code:
        return None, f"NVML did not start (error {code})"
    handle = ctypes.c_void_p()
    code = nvml.nvmlDeviceGetHandleByUUID(gpu.encode(), ctypes.byref(handle))
    if code:
        return None, f"NVML has no GPU {gpu} (error {code})"

    def meter() -> int:
        mj = ctypes.c_ulonglong()
        code = nvml.nvmlDeviceGetTotalEnergyConsumption(handle, ctypes.byref(mj))
        if code:
            raise RuntimeError(f"NVML's energy counter: error {code}")
        return mj.value
    try:
        meter()
    except RuntimeError as e:  # error 3: this GPU keeps no counter (before Volta)
        return None, str(e)
    return meter, None


def joules_per_call(meter, fn, seconds: float = 2.0, sync=None, clock=time.perf_counter):
    """(joules a call, mean watts, ms a call) of fn run back to back for about `seconds`;
    sync() waits for the GPU (torch.cuda.synchronize by default)."""
    if sync is None:
        import torch
        sync = torch.cuda.synchronize
    sync()  # host-device sync: before a timed window, and after it
    t = clock()
    for _ in range(3):  # a first estimate of a call's time, warm
        fn()
    sync()
    calls = max(1, math.ceil(seconds / max((clock() - t) / 3, 1e-6)))
    e0, t0 = meter(), clock()
    for _ in range(calls):
        fn()
    sync()
    e1, t1 = meter(), clock()
    joules, elapsed = (e1 - e0) / 1e3, t1 - t0
    return joules / calls, joules / elapsed, elapsed * 1e3 / calls
