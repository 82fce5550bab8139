"""lin1's three GEMMs at the GPU preset's shapes, by each GEMM library torch can call:
cuBLAS (torch.mm's default), cuBLASLt (torch.backends.cuda.preferred_blas_library), and
Inductor's max-autotune, which times cuBLAS against its Triton templates (persistent TMA
ones included) and keeps the fastest. What a speed-up of lin1's GEMMs could gain.

    forward  Y  = X @ W.T     M 1024,   N 16384, K 65536
    dX       dX = dY @ W      M 1024,   N 65536, K 16384
    dW       dW = dY.T @ X    M 16384,  N 65536, K 1024   (bf16 out: 2.1 GB written)

Each is 2.2 TFLOP: 2.22 ms at the H100's 989 TFLOP/s dense bf16 peak. GPU time by CUDA
events, the median of 20 calls after 3 warm-ups (bench/sharded_rank.cuda_ms).

Run on the device: python3 bench/lin1_gemms.py [--no-autotune] > lin1_gemms.md
"""

import argparse
import sys

import torch

sys.path.insert(0, ".")
from bench.sharded_rank import cuda_ms  # noqa: E402
from profiling.flops import peak_of  # noqa: E402

B, FEATURES, HIDDEN = 1024, 65536, 16384


def operands():
    make = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(B, FEATURES, **make)
    w = torch.randn(HIDDEN, FEATURES, **make) / FEATURES ** 0.5
    dy = torch.randn(B, HIDDEN, **make)
    return {"forward": (x, w.t()), "dX": (dy, w), "dW": (dy.t(), x)}


def time_library(library: str, pairs: dict) -> dict:
    previous = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library(library)
    try:
        return {name: cuda_ms(lambda a=a, b=b: torch.mm(a, b)) for name, (a, b) in pairs.items()}
    finally:
        torch.backends.cuda.preferred_blas_library(previous)


def time_autotuned(pairs: dict) -> dict:
    import torch._inductor.config as inductor
    inductor.max_autotune_gemm_backends = "ATEN,TRITON"
    if hasattr(inductor.triton, "enable_persistent_tma_matmul"):
        inductor.triton.enable_persistent_tma_matmul = True
    times = {}
    for name, (a, b) in pairs.items():
        mm = torch.compile(torch.mm, mode="max-autotune-no-cudagraphs", dynamic=False)
        mm(a, b)  # autotunes: Inductor prints each choice's time to stderr
        times[name] = cuda_ms(lambda a=a, b=b, mm=mm: mm(a, b))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-autotune", action="store_true",
                        help="cuBLAS and cuBLASLt only (max-autotune takes minutes)")
    args = parser.parse_args()
    peak = peak_of(torch.cuda.get_device_name())
    pairs = operands()
    columns = {"cuBLAS": time_library("cublas", pairs),
               "cuBLASLt": time_library("cublaslt", pairs)}
    if not args.no_autotune:
        columns["Inductor max-autotune"] = time_autotuned(pairs)
    flop = 2 * B * FEATURES * HIDDEN
    floor = flop / peak.bf16_flops * 1e3 if peak else None
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; GPU ms (% of the "
          f"dense bf16 peak){'' if floor is None else f'; the floor is {floor:.3f} ms'}\n")
    print("| GEMM | " + " | ".join(columns) + " |")
    print("|---|" + "---:|" * len(columns))
    for name in pairs:
        cells = []
        for times in columns.values():
            ms = times[name]
            cells.append(f"{ms:.3f}" + ("" if floor is None else f" ({floor / ms:.0%})"))
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
