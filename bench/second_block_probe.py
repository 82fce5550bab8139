"""Probe: the Triton second block against cuDNN's conv2 -> max-pool -> ReLU at the GPU
preset's size (B=1024, 4x128x128 bf16 channels_last input), forward and forward+backward,
with triton.testing.do_bench (median ms). Also checks value and gradients against the
eager block at that size. Run on the device: python3 bench/second_block_probe.py"""

import sys

import torch
import torch.nn.functional as F
from triton.testing import do_bench

sys.path.insert(0, ".")
from kernels.triton_second_block import second_block  # noqa: E402


def eager(x, w, b):
    with torch.autocast("cuda", torch.bfloat16):
        return F.relu(F.max_pool2d(F.conv2d(x, w, b, padding=1), 2))


def main(B=1024, S=128):
    torch.backends.cudnn.benchmark = True
    x = torch.randn(B, 4, S, S, device="cuda").bfloat16()
    x = x.to(memory_format=torch.channels_last).requires_grad_(True)
    conv = torch.nn.Conv2d(4, 16, 3, padding=1).cuda().to(memory_format=torch.channels_last)
    w, b = conv.weight, conv.bias
    g = torch.randn(B, 16, S // 2, S // 2, device="cuda").bfloat16()
    g = g.to(memory_format=torch.channels_last)
    for name, fn in (("cudnn", eager), ("triton", second_block)):
        y = fn(x, w, b)
        dx, dw, db = torch.autograd.grad(y, (x, w, b), g)
        if name == "cudnn":
            ref = (y.float(), dx.float(), dw, db)
        else:
            for label, a, r in zip(("y", "dx", "dw", "db"), (y, dx, dw, db), ref):
                err = ((a.float() - r.float()).norm() / r.float().norm()).item()
                print(f"triton vs cudnn {label}: rel {err:.2e}")
        fwd = do_bench(lambda: fn(x, w, b), quantiles=(0.5, 0.2, 0.8))
        both = do_bench(lambda: torch.autograd.grad(fn(x, w, b), (x, w, b), g),
                        quantiles=(0.5, 0.2, 0.8))
        print(f"{name}: forward {fwd[0]:.3f} ms (p20 {fwd[1]:.3f}, p80 {fwd[2]:.3f}); "
              f"forward+backward {both[0]:.3f} ms (p20 {both[1]:.3f}, p80 {both[2]:.3f})")


def kernel_ms(fn, calls=10) -> dict:
    """GPU ms per call of each kernel fn launches, from the profiler's kernel events."""
    fn()
    torch.cuda.synchronize()  # host-device sync: warm-up done before profiling
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()  # host-device sync: every kernel inside the profile
    out = {}
    for e in prof.key_averages():
        if e.device_time_total > 0:
            out[e.key[:40]] = e.device_time_total / calls / 1000
    return out


def shapes(B=1024, S=128):
    """Each kernel's GPU time over its launch shapes (module constants patched)."""
    import itertools

    import kernels.triton_second_block as sb
    x = torch.randn(B, 4, S, S, device="cuda").bfloat16().to(memory_format=torch.channels_last)
    w = torch.randn(16, 4, 3, 3, device="cuda") * 0.3
    b = torch.randn(16, device="cuda") * 0.1
    g = torch.randn(B, 16, S // 2, S // 2, device="cuda").bfloat16()
    g = g.to(memory_format=torch.channels_last)
    configs = [dict(BLOCK=blk, NUM_WARPS=nw) for blk, nw in
               itertools.product((64, 128, 256), (4, 8))]
    configs += [dict(WGRAD_PROGRAMS=p) for p in (264, 1056, 2112)]
    configs += [dict(XGRAD_BLOCK=blk, XGRAD_WARPS=nw) for blk, nw in
                itertools.product((32, 64, 128, 256), (2, 4, 8))]
    default = {k: getattr(sb, k) for k in ("BLOCK", "NUM_WARPS", "WGRAD_PROGRAMS",
                                           "XGRAD_BLOCK", "XGRAD_WARPS")}
    for cfg in configs:
        for k, v in {**default, **cfg}.items():
            setattr(sb, k, v)
        try:
            ms = kernel_ms(lambda: sb.second_block_backward(
                g, sb.second_block_op(x, w, b)[1], x, w, b))
        except Exception as exc:  # a shape that does not compile: say so, go on
            print(f"{cfg}: failed: {str(exc).splitlines()[0][:200]}")
            continue
        parts = ", ".join(f"{k.split('(')[0]} {v:.3f}" for k, v in sorted(ms.items()))
        print(f"{cfg}: total {sum(ms.values()):.3f} ms: {parts}")


if __name__ == "__main__":
    main()
    if "--shapes" in sys.argv:
        shapes()
