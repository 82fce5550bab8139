"""Where does the time of a profiled `loss` range go? The same loss call + sync, timed
with a host clock (median of N), bare and under the profiler's settings one at a time.

    python3 bench/loss_overhead.py            # GPU only; prints a table

The predictions require grad, as in a run (the model made them), so autograd records the
call. Columns: bare = loss + sync; +range = inside record_function; +profiler = under
torch.profiler (CPU+CUDA activities); +memory = profile_memory=True as train.py uses.
"""

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import torch  # noqa: E402

import losses  # noqa: E402
from core.tables import markdown  # noqa: E402
from studies.sweep_point import predictions, samples  # noqa: E402

N = 200


def timed(fn) -> float:
    samples = []
    for _ in range(N):
        t0 = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples) * 1e3


def main() -> None:
    # The workload's batch: its dataset's boxes, padded by the padded layout's collate.
    device = torch.device("cuda")
    _, host_targets = losses.get("padded").collate(samples(1024, 256, 3.0, seed=0))
    targets = tuple(t.to(device) for t in host_targets)
    pred = predictions(1024, 256, device, torch.bfloat16, seed=0)
    rows = []
    for name, kernel in (("padded", "triton"), ("kernel", "triton"), ("conditional", "triton"),
                         ("kernel", "cuda"), ("conditional", "cuda")):
        loss = losses.get(name, backend=kernel).loss
        call = lambda: loss(pred, targets)
        for _ in range(20):
            call()
        torch.cuda.synchronize()
        bare = timed(call)

        def in_range():
            with torch.profiler.record_function("loss"):
                call()
        ranged = timed(in_range)
        results = [bare, ranged]
        for memory in (False, True):
            acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
            with torch.profiler.profile(activities=acts, profile_memory=memory):
                results.append(timed(in_range))
        rows.append((f"{name}/{kernel}" if name != "padded" else name, *results))
    print(f"loss + sync, median of {N}, ms, batch 1024, bf16 predictions, "
          f"predictions requiring grad, {torch.cuda.get_device_name()}, torch {torch.__version__}")
    print(markdown(["strategy", "bare", "+range", "+profiler", "+memory"], rows,
                   left={"strategy"}))


if __name__ == "__main__":
    main()
