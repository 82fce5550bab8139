"""One point of make sweep: a strategy's loss, forward and backward, at one (batch size, box
capacity M, box sigma), measured alone (no model): its GPU, elapsed and host ms, launches
and copies a call, what its layout costs before the loss (collate, copies) and the bytes
it must move. What each figure is and how it is taken: docs/design.md, this module's
section."""

import math
import statistics
import time

import torch

import losses
from core.gc_pause import paused
from core.names import RAGGED, traits
from core.trees import leaves, map_leaves
from data import SyntheticFaces
from model.boxnet import boxes_from_raw
from profiling.trace_events import (
    GPU_CATS,
    RUNTIME_CATS,
    Windows,
    is_h2d,
    is_launch,
    profiler_events,
    quiet_cpu_profiler,
)

IMAGE_SIZE = 256  # the workload's: box coordinates in [0, 255]
_NO_IMAGE = torch.zeros(1, 1, 1, dtype=torch.uint8)  # the loss never sees the images


def samples(batch: int, capacity: int, sigma: float, seed: int) -> list:
    """The batch's (image, boxes) pairs from the dataset, boxes clipped at the capacity;
    the images replaced by a pixel (collating 8192 full images would cost seconds)."""
    dataset = SyntheticFaces(batch, IMAGE_SIZE, seed, box_sigma=sigma, max_boxes=capacity)
    return [(_NO_IMAGE, dataset[i][1]) for i in range(batch)]


def predictions(batch: int, capacity: int, device, dtype, seed: int) -> torch.Tensor:
    """Valid pixel boxes [B, M, 4] made on the device, as the model's head makes them."""
    gen = torch.Generator(device).manual_seed(seed)
    raw = torch.randn(batch, capacity, 4, device=device, generator=gen)
    return boxes_from_raw(raw, IMAGE_SIZE).to(dtype).requires_grad_(True)


def layout_bytes(loss: str, batch: int, capacity: int, valid: int, pred_bytes: int,
                 target_bytes: int, count_bytes: int) -> int:
    """The least a loss over this layout reads and writes, forward and backward: each pass
    reads the boxes it must look at (every slot for the padded layout; the valid ones for
    conditional, which skips the rest, and for the ragged and packed layouts, which hold no
    others) and the counts (for the packed layouts, each box's image and slot:
    count_bytes is then the index's element size); the backward writes the dense gradient
    of every prediction."""
    box = 4 * (pred_bytes + target_bytes)
    layout = traits(loss).layout  # an unknown strategy raises: never read as padded
    if layout == "list":
        read = valid * box
    elif layout == "packed":  # and the int64 offsets
        read = valid * (box + 2 * count_bytes) + (batch + 1) * 8
    elif loss == "conditional":
        read = valid * box + batch * count_bytes
    else:
        read = batch * capacity * box + batch * count_bytes
    return 2 * read + batch * capacity * 4 * pred_bytes


def peak_bandwidth(device) -> float | None:
    """The GPU's memory bandwidth in bytes/s from its clock and bus width (DDR: two
    transfers a clock); None on a CPU."""
    if device.type != "cuda":
        return None
    props = torch.cuda.get_device_properties(device)
    return 2 * props.memory_clock_rate * 1e3 * props.memory_bus_width / 8


def _quantiles(values: list[float]) -> tuple[float, float, float]:
    """(median, p20, p80)."""
    values = sorted(values)
    if len(values) == 1:
        return values[0], values[0], values[0]
    q = statistics.quantiles(values, n=10, method="inclusive")
    return statistics.median(values), q[1], q[7]


def _elapsed(call, device, rep_ms: int) -> tuple[float, float, float, str]:
    """(median, p20, p80) ms of call as the stream (GPU) or the wall clock (CPU) saw it,
    and which timer measured it."""
    if device.type == "cuda":
        from triton.testing import do_bench
        med, p20, p80 = do_bench(call, warmup=max(1, rep_ms // 4), rep=rep_ms,
                                 quantiles=[0.5, 0.2, 0.8])
        return med, p20, p80, "triton do_bench (CUDA events)"
    from torch.utils.benchmark import Timer
    m = Timer("call()", globals={"call": call}).blocked_autorange(min_run_time=rep_ms / 1e3)
    return (*_quantiles([t * 1e3 for t in m.times]), "torch.utils.benchmark (CPU wall)")


def _host_ms(call, device, calls: int = 5) -> float:
    """Median host time to issue one call (no sync inside: the GPU may still be working)."""
    times = []
    for _ in range(calls):
        start = time.perf_counter()
        call()
        times.append((time.perf_counter() - start) * 1e3)
    if device.type == "cuda":
        torch.cuda.synchronize(device)  # host-device sync: outside the timed calls
    return statistics.median(times)


def collate_times(collate, pairs, calls: int = 11) -> list[float]:
    """Host ms of each of `calls` collates of the point's samples, Python's garbage
    collector paused: a collection over the sweep's own heap (thousands of samples kept
    for the next strategies) landing inside one is not the collate's cost (results/sweep.md
    has the spread measured with and without the pause)."""
    import gc
    collate(pairs)  # warm: first-call allocations
    gc.collect()
    times = []
    with paused():
        for _ in range(calls):
            start = time.perf_counter()
            collate(pairs)
            times.append((time.perf_counter() - start) * 1e3)
    return times


def _profiled_calls(copy, call, device, calls: int) -> dict:
    """Each call's GPU ms, its copy's GPU ms, and its launches and H2D copies (its copy's
    included), from one profile of `calls` rounds of copy() then call(), each in its own
    range."""
    from torch.profiler import ProfilerActivity, profile, record_function
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda"
                                           else [])
    if device.type != "cuda":
        quiet_cpu_profiler()
    with profile(activities=activities) as prof:
        for _ in range(calls):
            with record_function("sweep_copy"):
                copy()
            with record_function("sweep_call"):
                call()
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # host-device sync: every activity in the trace
    return per_round(profiler_events(prof), calls)


def per_round(events: list[dict], calls: int) -> dict:
    """From a trace of `calls` rounds of a "sweep_copy" then a "sweep_call" range: each
    round's GPU ms (the activities its call launched), its copy's GPU ms, its launches and
    its H2D copies (its copy's included), tied to the ranges by the launching runtime
    call's correlation id, as profiling/trace_events.launchers ties them to phases."""
    events = [e for e in events if e.get("ph") == "X"]
    found = sorted((float(e["ts"]), float(e["ts"]) + float(e.get("dur", 0)), e["name"])
                   for e in events if e.get("cat") == "user_annotation"
                   and e["name"] in ("sweep_copy", "sweep_call"))
    # In time order: copy and call of round 0, of round 1, ... (they never overlap).
    windows = Windows([(start, end, (i // 2, name))
                        for i, (start, end, name) in enumerate(found)])
    gpu_us, copy_us, launches, h2d = [0.0] * calls, [0.0] * calls, [0] * calls, [0] * calls
    launched_by = {}  # correlation id -> (round, "sweep_copy" or "sweep_call")
    for e in events:
        if e.get("cat") not in RUNTIME_CATS:
            continue
        owner = windows.find(float(e["ts"]))
        if owner is None:
            continue
        launched_by[e.get("args", {}).get("correlation")] = owner
        launches[owner[0]] += is_launch(e.get("name", ""))
    for e in events:
        if e.get("cat") not in GPU_CATS:
            continue
        owner = launched_by.get(e.get("args", {}).get("correlation"))
        if owner is None:
            continue
        h2d[owner[0]] += is_h2d(e)
        if owner[1] == "sweep_call":
            gpu_us[owner[0]] += float(e.get("dur", 0))
        else:
            copy_us[owner[0]] += float(e.get("dur", 0))
    return {"gpu_ms": [u / 1e3 for u in gpu_us], "copy_ms": [u / 1e3 for u in copy_us],
            "launches": statistics.median(launches), "h2d": statistics.median(h2d)}


def loss_call(strategy, pred: torch.Tensor, targets):
    """One call as a sweep point measures it: the loss and its backward, the previous
    call's gradient dropped first."""
    def call():
        pred.grad = None
        strategy.loss(pred, targets).backward()
    return call


def measure(loss: str, backend: str, batch: int, capacity: int, sigma: float,
            pairs: list, device, dtype, seed: int, rep_ms: int) -> dict:
    """Every figure of one point for one strategy (raises if the strategy fails there)."""
    strategy = losses.get(loss, backend, capacity=capacity)
    collate_ms = statistics.median(collate_times(strategy.collate, pairs))
    _, host_targets = strategy.collate(pairs)
    if device.type == "cuda":  # pinned, as the loaders hand them over
        host_targets = map_leaves(lambda t: t.pin_memory(), host_targets)
    pred = predictions(batch, capacity, device, dtype, seed)
    targets = strategy.to_device(host_targets, device)

    call = loss_call(strategy, pred, targets)
    call()  # compile, build, allocate: outside every figure
    elapsed, e20, e80, timer = _elapsed(call, device, rep_ms)
    host = _host_ms(call, device)
    # Enough calls for quantiles, within ~rep_ms (the loop's trace is ~10^4 events a call).
    calls = max(3, min(20, int(rep_ms / max(elapsed, 1e-3))))
    counts = _profiled_calls(lambda: strategy.to_device(host_targets, device), call, device,
                             calls)
    if device.type == "cuda":
        gpu, g20, g80 = _quantiles(counts["gpu_ms"])
        copy_ms = _quantiles(counts["copy_ms"])[0]
    else:  # no GPU activities: the wall time is all there is
        gpu, g20, g80 = elapsed, e20, e80
        copy_ms = None
    valid = sum(int(boxes.shape[0]) for _, boxes in pairs)
    # Padded layouts: (boxes [B, M, 4], counts [B]); ragged: a list of [n, 4] boxes.
    count_bytes = 0 if loss in RAGGED else host_targets[1].element_size()
    nbytes = layout_bytes(loss, batch, capacity, valid, pred.element_size(),
                          host_targets[0].element_size(), count_bytes)
    peak = peak_bandwidth(device)
    bandwidth = nbytes / (gpu * 1e-3) if gpu > 0 else float("nan")
    return {"GPU ms": gpu, "GPU p20 ms": g20, "GPU p80 ms": g80, "elapsed ms": elapsed,
            "elapsed p20 ms": e20, "elapsed p80 ms": e80, "host ms": host,
            "launches": counts["launches"], "H2D copies": counts["h2d"],
            "collate ms": collate_ms, "H2D ms": copy_ms,
            "H2D bytes": sum(t.numel() * t.element_size() for t in leaves(host_targets)),
            "targets ms": collate_ms + (copy_ms or 0.0) + gpu,
            "valid boxes": valid, "boxes per image": valid / batch, "bytes": nbytes,
            "GB/s": bandwidth / 1e9,
            "% of peak": None if peak is None else 100 * bandwidth / peak, "timer": timer}


def sigma_label(sigma: float) -> str:
    return "full" if math.isinf(sigma) else f"{sigma:g}"
