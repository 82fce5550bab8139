"""lin1's dW GEMM with the shadow SGD in its epilogue (CUTLASS 3, kernels/lin1/dw_sgd.py)
against the two apart (cuBLAS's dW, then the Triton shadow SGD), at the GPU preset's
shape: M 16384, N 65536, K 1024.

Correctness first: at three small shapes, two steps each from zero momentum, every variant
against the apart path (the share of shadow and momentum elements bitwise equal) and
against a float64 reference (relative error). Then GPU time by CUDA events: the mean of 5
calls, 5 rounds that take the candidates in turn, after 3 warm-ups; median, min, max.

Run on the device, with CUTLASS's headers (pip install --no-deps nvidia-cutlass):
    python3 bench/dw_sgd_fused.py > dw_sgd_fused.json
"""

import json
import statistics
import sys
import time

import torch

sys.path.insert(0, ".")
from kernels.lin1 import dw_sgd  # noqa: E402
from kernels.lin1.shadow_sgd import shadow_sgd_step  # noqa: E402

M, N, K = 16384, 65536, 1024
LR, MU = 1e-2, 0.9


def apart(dy, x, master, buf, shadow, grad, lr=LR, first=False):
    torch.mm(dy.t(), x, out=grad)
    shadow_sgd_step(master, grad, buf, shadow, lr, MU, first)


def check(m: int, n: int, k: int, variant: int, steps: int = 2) -> dict:
    """Two steps of the fused kernel and of the apart path from the same master."""
    gen = torch.Generator(device="cuda").manual_seed(m * n + k)
    master = torch.randn(m, n, device="cuda", generator=gen)
    fused = [master.clone(), torch.zeros_like(master),
             torch.empty(m, n, device="cuda", dtype=torch.bfloat16)]
    ref = [master.clone(), torch.zeros_like(master), torch.empty_like(fused[2])]
    m64, b64 = master.double(), torch.zeros_like(master, dtype=torch.float64)
    grad = torch.empty_like(fused[2])
    for step in range(steps):
        dy = torch.randn(k, m, device="cuda", generator=gen).bfloat16()
        x = torch.randn(k, n, device="cuda", generator=gen).bfloat16()
        dw_sgd.dw_sgd_step(dy, x, *fused, LR, MU, variant)
        apart(dy, x, *ref, grad, first=step == 0)
        g64 = (dy.double().t() @ x.double()).bfloat16().double()
        b64 = MU * b64 + g64
        m64 = m64 - LR * b64

    def rel(a, r):
        return ((a.double() - r).abs().max() / r.abs().max()).item()
    return {"shadow_equal_to_apart": (fused[2] == ref[2]).float().mean().item(),
            "momentum_equal_to_apart": (fused[1] == ref[1]).float().mean().item(),
            "master_rel_err_vs_f64": rel(fused[0], m64),
            "momentum_rel_err_vs_f64": rel(fused[1], b64)}


def timings(rounds: int = 5, calls: int = 5) -> dict:
    gen = torch.Generator(device="cuda").manual_seed(1)
    dy = torch.randn(K, M, device="cuda", generator=gen).bfloat16()
    x = torch.randn(K, N, device="cuda", generator=gen).bfloat16()
    master = torch.randn(M, N, device="cuda", generator=gen) * 0.01
    buf = torch.zeros_like(master)
    shadow = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
    grad = torch.empty_like(shadow)
    candidates = {
        "dW GEMM alone (cuBLAS)": lambda: torch.mm(dy.t(), x, out=grad),
        "shadow SGD alone (Triton)": lambda: shadow_sgd_step(master, grad, buf, shadow, 1e-4,
                                                             MU, False),
        "apart": lambda: apart(dy, x, master, buf, shadow, grad, lr=1e-4)}
    for v, name in enumerate(dw_sgd.VARIANTS):
        candidates[f"fused {name}"] = (
            lambda v=v: dw_sgd.dw_sgd_step(dy, x, master, buf, shadow, 1e-4, MU, v))
    for run in candidates.values():
        for _ in range(3):
            run()
    times = {name: [] for name in candidates}
    for _ in range(rounds):
        for name, run in candidates.items():
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
            for _ in range(calls):
                run()
            end.record()
            torch.cuda.synchronize()  # sync: the round's time
            times[name].append(start.elapsed_time(end) / calls)
    return {name: {"median": round(statistics.median(t), 3), "min": round(min(t), 3),
                   "max": round(max(t), 3)} for name, t in times.items()}


def main() -> None:
    start = time.time()
    dw_sgd.load()
    out = {"device": torch.cuda.get_device_name(), "torch": torch.__version__,
           "build_s": round(time.time() - start, 1), "checks": {}}
    for v, name in enumerate(dw_sgd.VARIANTS):
        for shape in ((256, 512, 128), (384, 640, 1024), (1024, 2048, 64)):
            out["checks"][f"{name} {'x'.join(map(str, shape))}"] = check(*shape, v)
    out["gpu_ms"] = timings()
    json.dump(out, sys.stdout, indent=1)


if __name__ == "__main__":
    main()
