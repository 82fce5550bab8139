"""What --float8-lin1 costs and saves at the GPU preset's shapes, each piece alone: lin1's
three GEMMs in bf16 and float8, every cast the float8 step adds, lin1's update with and
without its e4m3 copy, and the whole layer both ways; GPU time by CUDA events.

Run on the device: python3 bench/float8_lin1.py

The design in full: docs/design.md, this module's section."""

import argparse
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
from bench.needs_gpu import require_cuda  # noqa: E402
from bench.sharded_rank import cuda_ms  # noqa: E402
from kernels.lin1.float8_cast import cast_weight, new_state, transpose  # noqa: E402
from kernels.lin1.float8_linear import E4M3, E5M2, float8_linear, quantized  # noqa: E402
from kernels.lin1.master_halves import split  # noqa: E402
from kernels.lin1.shadow_sgd import shadow_sgd_step  # noqa: E402

B, FEATURES, HIDDEN = 1024, 65536, 16384


def gemms(x, w, dy, x8, xs, w8, w8t, ws, dy8, dys) -> dict:
    """{name: (bf16 call, float8 call)} of the three GEMMs, on operands cast beforehand."""
    x8t, dy8t = x8.t().contiguous(), dy8.t().contiguous()
    mm = torch._scaled_mm
    return {
        "forward": (lambda: x @ w.t(), lambda: mm(x8, w8.t(), scale_a=xs, scale_b=ws,
                                                 out_dtype=torch.bfloat16, use_fast_accum=True)),
        "dX": (lambda: dy @ w, lambda: mm(dy8, w8t.t(), scale_a=dys, scale_b=ws,
                                          out_dtype=torch.bfloat16)),
        "dW": (lambda: dy.t() @ x, lambda: mm(dy8t, x8t.t(), scale_a=dys, scale_b=xs,
                                              out_dtype=torch.bfloat16)),
    }


def updates(w, w8, w8t, state, inverse) -> dict:
    """{name: call} of lin1's update at the step's settings (split master, the weight
    stored where it changed, lr 1e-4), alone and writing the e4m3 copy, and the copy's
    transpose alone. Each call updates the weight again: the figures are of one step."""
    weight, low, ties = split(w.float())
    grad = (torch.randn_like(w, dtype=torch.float32) * 1e-3).bfloat16()
    buf = torch.zeros(w.shape, device="cuda")

    def step(float8):
        shadow_sgd_step(low, grad, buf, weight, 1e-4, 0.9, False, ties, skip_unchanged=True,
                        float8=float8)

    return {"the update alone": lambda: step(None),
            "the update writing the e4m3 copy, with the roll and the transpose":
                lambda: step((w8, w8t, state, inverse)),
            "the transpose alone": lambda: transpose(w8, w8t)}


def layer(x, w, dy, w8, w8t, inverse, compiled: bool):
    """(bf16 call, float8 call): the layer's forward and backward, x's gradient included."""
    xg = x.detach().requires_grad_()
    wg = w.detach().requires_grad_()

    def bf16():
        F.linear(xg, wg).backward(dy)

    def f8():
        float8_linear(xg, wg, None, w8, w8t, inverse).backward(dy)
    if compiled:
        bf16, f8 = torch.compile(bf16), torch.compile(f8)
    return bf16, f8


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    require_cuda("float8 GEMMs, an H100 or H200")
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x = torch.randn(B, FEATURES, **bf).relu()
    w = torch.randn(HIDDEN, FEATURES, **bf) / FEATURES ** 0.5
    dy = torch.randn(B, HIDDEN, **bf) * 1e-3
    w8 = torch.empty(HIDDEN, FEATURES, dtype=E4M3, device="cuda")
    w8t = torch.empty(FEATURES, HIDDEN, dtype=E4M3, device="cuda")
    state, inverse = new_state(w)
    cast_weight(w, w8, w8t, state, inverse)
    x8, xs = quantized(x, E4M3)
    dy8, dys = quantized(dy, E5M2)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; GPU ms, the median of "
          "20 calls\n")
    print("| GEMM | bf16 | float8 | saved |\n|---|---:|---:|---:|")
    total = [0.0, 0.0]
    for name, (plain, scaled) in gemms(x, w, dy, x8, xs, w8, w8t, inverse, dy8,
                                       dys).items():
        a, b = cuda_ms(plain), cuda_ms(scaled)
        total = [total[0] + a, total[1] + b]
        print(f"| {name} | {a:.3f} | {b:.3f} | {a - b:.3f} |")
    print(f"| all three | {total[0]:.3f} | {total[1]:.3f} | {total[0] - total[1]:.3f} |\n")
    quantize_x = torch.compile(lambda: quantized(x, E4M3))
    quantize_dy = torch.compile(lambda: quantized(dy, E5M2))
    casts = {
        "weight -> both float8 layouts (the Triton kernel, a step)":
            lambda: cast_weight(w, w8, w8t, state, inverse),
        "x -> e4m3, eager": lambda: quantized(x, E4M3),
        "x -> e4m3, compiled": quantize_x,
        "x8 transposed (for dW)": lambda: x8.t().contiguous(),
        "dy -> e5m2, eager": lambda: quantized(dy, E5M2),
        "dy -> e5m2, compiled": quantize_dy,
        "dy8 transposed (for dW)": lambda: dy8.t().contiguous(),
    }
    print("| cast | GPU ms |\n|---|---:|")
    for name, call in casts.items():
        print(f"| {name} | {cuda_ms(call):.3f} |")
    print("\n| lin1's update (split master) | GPU ms |\n|---|---:|")
    for name, call in updates(w, w8, w8t, state, inverse).items():
        print(f"| {name} | {cuda_ms(call):.3f} |")
    print("\n| the layer, forward and backward | bf16 | float8 | saved |\n|---|---:|---:|---:|")
    for compiled in (False, True):
        plain, scaled = layer(x, w, dy, w8, w8t, inverse, compiled)
        a, b = cuda_ms(plain), cuda_ms(scaled)
        print(f"| {'compiled' if compiled else 'eager'} | {a:.3f} | {b:.3f} | {a - b:.3f} |")


if __name__ == "__main__":
    main()
