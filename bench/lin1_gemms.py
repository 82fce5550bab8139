"""lin1's three GEMMs at the GPU preset's shapes (forward, dX, dW: 2.2 TFLOP each), by each
GEMM library torch can call: cuBLAS, cuBLASLt, and Inductor's max-autotune over its
Triton templates. What a speed-up of lin1's GEMMs could gain; GPU time by CUDA events.

Run on the device: python3 bench/lin1_gemms.py [--no-autotune] > lin1_gemms.md

The design in full: docs/design.md, this module's section."""

import argparse
import statistics
import sys

import torch

sys.path.insert(0, ".")
from bench.needs_gpu import require_cuda  # noqa: E402
from bench.sharded_rank import cuda_ms  # noqa: E402
from profiling.flops import peak_of  # noqa: E402

B, FEATURES, HIDDEN = 1024, 65536, 16384


def operands():
    make = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(B, FEATURES, **make)
    w = torch.randn(HIDDEN, FEATURES, **make) / FEATURES ** 0.5
    dy = torch.randn(B, HIDDEN, **make)
    return {"forward": (x, w.t()), "dX": (dy, w), "dW": (dy.t(), x)}


def compiled_mms(pairs: dict) -> dict:
    """Each GEMM through torch.compile's max-autotune (Inductor prints each choice's time
    to stderr as it autotunes, on the first call)."""
    import torch._inductor.config as inductor
    inductor.max_autotune_gemm_backends = "ATEN,TRITON"
    if hasattr(inductor.triton, "enable_persistent_tma_matmul"):
        inductor.triton.enable_persistent_tma_matmul = True
    calls = {}
    for name, (a, b) in pairs.items():
        mm = torch.compile(torch.mm, mode="max-autotune-no-cudagraphs", dynamic=False)
        mm(a, b)
        calls[name] = lambda a=a, b=b, mm=mm: mm(a, b)
    return calls


def measured(columns: dict, rounds: int) -> dict:
    """{column: {gemm: ms}}: the median over `rounds` rounds, each timing every column in
    turn, so that a clock that drifts over the run (a GEMM at 700 W heats the chip) does
    not favour whichever column runs first. A column is (BLAS library or None, calls)."""
    times = {col: {name: [] for name in calls} for col, (_, calls) in columns.items()}
    previous = torch.backends.cuda.preferred_blas_library()
    for _ in range(rounds):
        for col, (library, calls) in columns.items():
            torch.backends.cuda.preferred_blas_library(library or previous)
            for name, call in calls.items():
                times[col][name].append(cuda_ms(call))
    torch.backends.cuda.preferred_blas_library(previous)
    return {col: {name: statistics.median(v) for name, v in by.items()}
            for col, by in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-autotune", action="store_true",
                        help="cuBLAS and cuBLASLt only (max-autotune takes a minute)")
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    require_cuda("it times lin1's three GEMMs on the device")
    peak = peak_of(torch.cuda.get_device_name())
    pairs = operands()
    plain = {name: (lambda a=a, b=b: torch.mm(a, b)) for name, (a, b) in pairs.items()}
    columns = {"cuBLAS": ("cublas", plain), "cuBLASLt": ("cublaslt", plain)}
    if not args.no_autotune:
        columns["Inductor max-autotune"] = (None, compiled_mms(pairs))
    times = measured(columns, args.rounds)
    flop = 2 * B * FEATURES * HIDDEN
    floor = flop / peak.bf16_flops * 1e3 if peak else None
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; GPU ms (% of the "
          f"dense bf16 peak), the median of {args.rounds} rounds"
          f"{'' if floor is None else f'; the floor is {floor:.3f} ms'}\n")
    print("| GEMM | " + " | ".join(times) + " |")
    print("|---|" + "---:|" * len(times))
    for name in pairs:
        cells = [f"{t[name]:.3f}" + ("" if floor is None else f" ({floor / t[name]:.0%})")
                 for t in times.values()]
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
