"""Probe: the third block's backward (--triton-conv-pool-bwd, kernels/triton_conv_pool_bwd.py)
against the one it replaces (the pool's backward kernel, then cuDNN's input and weight
gradients, tuned) at the GPU preset's size: B=1024, x [16, 64, 64] bf16 channels_last,
its forward by --triton-conv-pool. GPU ms per call of each kernel from the profiler's
kernel events; then, with --shapes, the new kernels over their launch shapes (module
constants patched). Also checks the gradients against the old backward at that size.
Run on the device: python3 bench/conv_pool_bwd_probe.py [--shapes]"""

import itertools
import sys

import torch

sys.path.insert(0, ".")
import kernels.triton_conv_pool_bwd as bwd  # noqa: E402
from bench.second_block_probe import kernel_ms  # noqa: E402
from kernels.triton_conv_pool import conv_pool_bias_relu_op  # noqa: E402


def inputs(B=1024, S=64):
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(B, 16, S, S, device="cuda", generator=gen).bfloat16()
    x = x.to(memory_format=torch.channels_last)
    conv = torch.nn.Conv2d(16, 64, 3, padding=1).cuda().to(memory_format=torch.channels_last)
    w, b = conv.weight.detach(), conv.bias.detach()
    g = torch.randn(B, 64, S // 2, S // 2, device="cuda", generator=gen).bfloat16()
    return x, w, b, g.to(memory_format=torch.channels_last)


def grads(x, w, b, g, triton_backward: bool):
    x, w, b = (t.detach().requires_grad_(True) for t in (x, w, b))
    y, _ = conv_pool_bias_relu_op(x, w, b, triton_backward)
    return torch.autograd.grad(y, (x, w, b), g)


def main():
    torch.backends.cudnn.benchmark = True
    x, w, b, g = inputs()
    old, new = grads(x, w, b, g, False), grads(x, w, b, g, True)
    for label, a, r in zip(("dx", "dw", "db"), new, old, strict=True):
        err = ((a.float() - r.float()).norm() / r.float().norm()).item()
        print(f"new vs old {label}: rel {err:.2e}")
    _, code = conv_pool_bias_relu_op(x, w, b)
    for name, flag in (("old", False), ("new", True)):
        xs, ws, bs = (t.detach().requires_grad_(True) for t in (x, w, b))
        y, _ = conv_pool_bias_relu_op(xs, ws, bs, flag)
        ms = kernel_ms(lambda: torch.autograd.grad(y, (xs, ws, bs), g, retain_graph=True))
        parts = ", ".join(f"{k.split('(')[0]} {v:.3f}" for k, v in sorted(ms.items()))
        print(f"{name} backward: total {sum(ms.values()):.3f} ms: {parts}")
    if "--shapes" in sys.argv:
        shapes(x, w, g, code)
    if "--asm" in sys.argv:
        compiled(sys.argv[sys.argv.index("--asm") + 1])


def compiled(out: str):
    """Registers, spills and shared memory of each compiled variant of the two kernels
    (and the forward's, for comparison); their TTGIR and PTX written under out."""
    import os

    import kernels.triton_conv_pool as fwd
    os.makedirs(out, exist_ok=True)
    for kernel in (bwd._conv_pool_xgrad_kernel, bwd._conv_pool_wgrad_kernel,
                   fwd._conv_pool_fwd_kernel):
        for n, k in enumerate(kernel.device_caches[torch.cuda.current_device()][0].values()):
            name = f"{kernel.__name__}-{n}"
            print(f"{name}: {k.n_regs} registers, {k.n_spills} spills, "
                  f"{k.metadata.shared} B shared, {k.metadata.num_warps} warps")
            for ext in ("ttgir", "ptx"):
                with open(f"{out}/{name}.{ext}", "w") as f:
                    f.write(k.asm[ext])


def shapes(x, w, g, code):
    """Each new kernel's GPU time over its launch shapes."""
    keys = ("XGRAD_BLOCK", "XGRAD_WARPS", "WGRAD_BLOCK", "WGRAD_WARPS", "PROGRAMS", "STAGES")
    default = {k: getattr(bwd, k) for k in keys}
    configs = [dict(XGRAD_BLOCK=blk, XGRAD_WARPS=nw, WGRAD_BLOCK=blk, WGRAD_WARPS=nw)
               for blk, nw in itertools.product((32, 64, 128), (4, 8))]
    configs += [dict(PROGRAMS=p) for p in (132, 528, 1056)] + [dict(STAGES=2)]
    for cfg in configs:
        for k, v in {**default, **cfg}.items():
            setattr(bwd, k, v)
        try:
            ms = kernel_ms(lambda: bwd.conv_pool_backward(g, code, x, w, True))
        except Exception as exc:  # a shape that does not compile: say so, go on
            print(f"{cfg}: failed: {str(exc).splitlines()[0][:200]}")
            continue
        parts = ", ".join(f"{k.split('(')[0]} {v:.3f}" for k, v in sorted(ms.items()))
        print(f"{cfg}: total {sum(ms.values()):.3f} ms: {parts}")
    for k, v in default.items():
        setattr(bwd, k, v)


if __name__ == "__main__":
    main()
