"""The train step's roofline on this GPU. Each phase of the GPU preset's step alone, its
FLOPs and bytes counted from the shapes, its GPU time, what it achieves against the
device's peaks, and its floor; then the step's floor two ways, and the whole step. With
--energy, joules a call and mean watts from NVML's energy counter: at the card's power cap
a step's time follows its joules.

Run on the device: python3 bench/roofline.py [--loss padded] [--energy] > roofline.md

The design in full: docs/design.md, this module's section."""

import argparse
import statistics
import sys

import torch
import torch.nn.functional as F

sys.path.insert(0, ".")
import train  # noqa: E402
from bench.needs_gpu import require_cuda  # noqa: E402
from bench.sharded_rank import cuda_ms, one_batch, top_kernels  # noqa: E402
from kernels.lin1.master_halves import split  # noqa: E402
from kernels.lin1.shadow_sgd import shadow_sgd_step  # noqa: E402
from profiling.energy import joules_per_call, open_meter  # noqa: E402
from profiling.flops import peak_of  # noqa: E402
from profiling.gpu_clocks import gpu_id  # noqa: E402
from training import speedups  # noqa: E402


def peaks() -> tuple[float, float]:
    """The dense bf16 peak and HBM bandwidth of this GPU (profiling/flops.py's PEAKS)."""
    name = torch.cuda.get_device_name()
    peak = peak_of(name)
    if peak is None or peak.hbm_bytes_per_s is None:
        sys.exit(f"error: no peaks known for {name}: add them to profiling/flops.py's PEAKS")
    return peak.bf16_flops, peak.hbm_bytes_per_s


# lin1's phases by name: the step's table picks them from lin1_phases' rows.
FORWARD, DX, DW = "lin1 forward GEMM", "lin1 dX GEMM", "lin1 dW GEMM (bf16 dW)"
SGD = "lin1 shadow SGD"


def measured(phase: str, flops: int, moved: int, fn, meter, reps: int = 20) -> dict:
    """A phase's row: its GPU time (CUDA events) and, given a meter, its joules back to back
    for two seconds, taken at once while its tensors are alive."""
    row = dict(phase=phase, flops=flops, bytes=moved, ms=cuda_ms(fn, reps))
    if meter is not None:
        row["joules"], row["watts"], row["ms_back_to_back"] = joules_per_call(meter, fn)
    return row


def lin1_phases(B: int, Fe: int, H: int, meter=None) -> list[dict]:
    """lin1's GEMMs and its shadow SGD, each with its own tensors (freed between)."""
    return gemm_phases(B, Fe, H, meter) + [sgd_phase(H, Fe, meter)]


def gemm_phases(B: int, Fe: int, H: int, meter=None) -> list[dict]:
    """lin1's forward, input-gradient and weight-gradient GEMMs."""
    bf = dict(device="cuda", dtype=torch.bfloat16)
    x, w = torch.randn(B, Fe, **bf), torch.randn(H, Fe, **bf) * 0.01
    bias, dy = torch.randn(H, **bf), torch.randn(B, H, **bf)
    gemm = 2 * B * Fe * H
    act = (B * Fe + B * H) * 2
    rows = [
        (FORWARD, gemm, act + H * Fe * 2, lambda: F.linear(x, w, bias)),
        (DX, gemm, act + H * Fe * 2, lambda: dy @ w),
        (DW, gemm, act + H * Fe * 2, lambda: dy.t() @ x),
    ]
    return [measured(n, f, b, fn, meter) for n, f, b, fn in rows]


def sgd_update(H: int, Fe: int, gradient_rms: float = 5e-6):
    """(the call, the bf16 weight it writes): lin1's shadow SGD as the step runs it
    (--split-master, --skip-unchanged-weight) at the step's scales, its momentum warmed
    to ~98 % of its steady 10x the gradient. Weights kaiming-uniform as lin1's (|w| <=
    1/256), lr 1e-4, a gradient whose momentum has the rms a GPU-preset run's has (4-6e-5,
    results/step.md)."""
    w = (torch.rand(H, Fe, device="cuda") * 2 - 1) / 256
    w, low, ties = split(w)
    buf = torch.zeros(H, Fe, device="cuda")
    grad = (torch.randn(H, Fe, device="cuda") * gradient_rms).bfloat16()

    def update():
        shadow_sgd_step(low, grad, buf, w, 1e-4, 0.9, False, ties, skip_unchanged=True)
    for _ in range(40):
        update()
    return update, w


def sgd_bytes(update, w) -> tuple[int, float]:
    """(bytes, share of the weight's 32-byte sectors written) of one call of sgd_update's
    update: 16 an element, the tie bits' words (1/8), and 2 for each element of a sector of
    the weight that the call changed (measured, the momentum at its steady size): only
    those are written."""
    before = w.view(torch.int16).clone()
    update()
    # host-device sync: the share comes back to the host
    sectors = (w.view(torch.int16) != before).view(-1, 16).any(1).float().mean().item()
    del before
    return w.numel() * 16 + w.numel() // 8 + round(sectors * w.numel() * 2), sectors


def sgd_phase(H: int, Fe: int, meter=None) -> dict:
    """lin1's shadow SGD's row: sgd_update's call, sgd_bytes' bytes."""
    update, w = sgd_update(H, Fe)
    moved, sectors = sgd_bytes(update, w)
    row = measured(SGD, 0, moved, update, meter)
    row["sectors_written"] = sectors
    return row


def lin2_phases(B: int, H: int, out: int, meter=None) -> list[dict]:
    bf = dict(device="cuda", dtype=torch.bfloat16)
    h, w2, dout = torch.randn(B, H, **bf), torch.randn(out, H, **bf), torch.randn(B, out, **bf)
    gemm = 2 * B * H * out
    moved = (B * H + H * out + B * out) * 2
    def three():
        return h @ w2.t(), dout @ w2, dout.t() @ h
    return [measured("lin2 three GEMMs", 3 * gemm, 3 * moved, three, meter)]


def trunk_counts(B: int, S: int) -> tuple[int, int]:
    """(FLOPs, bytes) of the four conv blocks' forward and backward: conv_i takes 4^i
    channels at S/2^i to 4^(i+1) pooled to half the side; conv1 has no input gradient."""
    flops = moved = 0
    for i in range(4):
        cin, cout, side = 4 ** i, 4 ** (i + 1), S // 2 ** i
        fwd = 2 * B * side * side * cin * cout * 9
        flops += fwd * (2 if i == 0 else 3)
        x_bytes = B * cin * side * side * (1 if i == 0 else 2)  # uint8 images first
        y_bytes = B * cout * (side // 2) ** 2 * 2
        # forward: x, y; backward: x again, dy, and dx (not for the images)
        moved += x_bytes + y_bytes + x_bytes + y_bytes + (0 if i == 0 else x_bytes)
    return flops, moved


def trunk_call(model, images):
    """One call of the trunk's forward and backward (flat_features, its flatten included),
    compiled apart as it is within the step's compiled model."""
    features = torch.compile(model.flat_features)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        grad = torch.randn_like(features(images))

    def fwd_bwd():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = features(images)
        out.backward(grad)
    return fwd_bwd


def trunk_phase(model, images, meter=None) -> dict:
    """The trunk's forward and backward (trunk_call)."""
    fwd_bwd = trunk_call(model, images)
    flops, moved = trunk_counts(images.shape[0], images.shape[-1])
    return measured("conv trunk forward + backward", flops, moved, fwd_bwd, meter, reps=10)


def small_sgd_phase(model, meter=None) -> dict:
    """torch's fused SGD over every parameter but lin1's weight: 20 bytes a parameter
    (fp32 parameter, gradient and momentum)."""
    params = [p for n, p in model.named_parameters() if n != "lin1.weight"]
    for p in params:
        p.grad = torch.zeros_like(p)
    opt = torch.optim.SGD(params, lr=1e-4, momentum=0.9, fused=True)
    n = sum(p.numel() for p in params)
    return measured(f"fused SGD of the other {n / 1e6:.1f} M parameters", 0, n * 20, opt.step,
                    meter)


def preset_step(train_args: list[str]):
    """(cfg, model, train-step functions, one batch on the GPU): train.py's step with
    train_args (the GPU preset), built as train.py builds it, compiled afresh."""
    import losses
    cfg = train.parse_config(train_args)
    used = speedups.resolve(train.asked_of(cfg), True)["on"]
    speedups.set_process_flags(used, True, many_runs=True)
    strategy = losses.get(cfg.loss, backend=cfg.backend, capacity=cfg.max_boxes)
    device = torch.device("cuda", 0)
    torch._dynamo.reset()
    model, runner, optimizer = speedups.build(used, device, False, train.model_sizes(cfg),
                                              cfg.amp, cfg.lr)
    fns = train.make_step(cfg, strategy, runner, optimizer, device)
    return cfg, model, fns, one_batch(cfg, strategy, device)


def step_ms(args):
    """(median step ms, model, images, the step on its batch) of the whole train step,
    CUDA events."""
    _, model, fns, batch = preset_step(["--loss", args.loss, "--backend", args.backend])
    for _ in range(8):
        fns.train_step(*batch)
    pairs = []
    for _ in range(30):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fns.train_step(*batch)
        e.record()
        pairs.append((s, e))
    torch.cuda.synchronize()  # host-device sync: once, after the timed steps
    if args.top:
        print(top_kernels("the step", fns.train_step, batch, args.top), flush=True)
    if args.ops:
        print(top_ops("the step", fns.train_step, batch, args.ops), flush=True)
    return (statistics.median(s.elapsed_time(e) for s, e in pairs), model, batch[0],
            lambda: fns.train_step(*batch))


def top_ops(label: str, step, batch, top: int) -> str:
    """The ATen ops of 3 profiled steps by their own GPU time per step, with their input
    shapes: which op launches a kernel that top_kernels names only by its template."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA],
                 record_shapes=True) as prof:
        for _ in range(3):
            step(*batch)
        torch.cuda.synchronize()  # host-device sync: the profiled steps are done
    rows = sorted(prof.key_averages(group_by_input_shape=True),
                  key=lambda e: -e.self_device_time_total)[:top]
    lines = [f"{label}: {e.self_device_time_total / 3e3:7.3f} ms/step {e.count // 3:3d}x "
             f"{e.key[:40]} {str(e.input_shapes)[:110]}" for e in rows]
    return "\n".join([f"### {label}: ATen ops by their own GPU time per step", *lines, ""])


def table(rows: list[dict], peak_flops: float, peak_bw: float) -> str:
    lines = ["| phase | GFLOP | GB | GPU ms | TFLOP/s | TB/s | floor ms | bound | floor / ms |",
             "|---|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in rows:
        compute, memory = r["flops"] / peak_flops * 1e3, r["bytes"] / peak_bw * 1e3
        floor = max(compute, memory)
        lines.append(f"| {r['phase']} | {r['flops'] / 1e9:.1f} | {r['bytes'] / 1e9:.3f} | "
                     f"{r['ms']:.3f} | {r['flops'] / r['ms'] / 1e9:.0f} | "
                     f"{r['bytes'] / r['ms'] / 1e9:.2f} | {floor:.3f} | "
                     f"{'compute' if compute >= memory else 'memory'} | "
                     f"{floor / r['ms']:.0%} |")
    return "\n".join(lines)


def floors(rows: list[dict], peak_flops: float, peak_bw: float) -> str:
    compute = sum(r["flops"] for r in rows) / peak_flops * 1e3
    memory = sum(r["bytes"] for r in rows) / peak_bw * 1e3
    serial = sum(max(r["flops"] / peak_flops, r["bytes"] / peak_bw) for r in rows) * 1e3
    measured = sum(r["ms"] for r in rows)
    return (f"phases measured alone: {measured:.2f} ms; sum of their floors (one after "
            f"the other): {serial:.2f} ms; compute-bound sum {compute:.2f} ms, memory-bound "
            f"sum {memory:.2f} ms: overlapped floor {max(compute, memory):.2f} ms")


def energy_table(rows: list[dict], step, meter) -> str:
    """Each phase's joules a call (measured with its row) and the whole step's, back to
    back for two seconds."""
    lines = ["| phase | ms a call (back to back) | J a call | mean W | share of the phases' J |",
             "|---|---:|---:|---:|---:|"]
    total = sum(r["joules"] for r in rows)
    for r in rows:
        lines.append(f"| {r['phase']} | {r['ms_back_to_back']:.3f} | {r['joules']:.3f} | "
                     f"{r['watts']:.0f} | {r['joules'] / total:.0%} |")
    joules, watts, ms = joules_per_call(meter, step)
    lines.append(f"| **the whole step** | {ms:.3f} | {joules:.3f} | {watts:.0f} | "
                 f"({joules / total:.0%} of the phases' sum) |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loss", default="padded")
    ap.add_argument("--backend", default="triton")
    ap.add_argument("--lin1-only", action="store_true", help="lin1's phases only (no step)")
    ap.add_argument("--top", type=int, default=0, help="each step's N largest kernels (a "
                    "profile of 3 steps)")
    ap.add_argument("--ops", type=int, default=0, help="each step's N costliest ATen ops, "
                    "with their input shapes")
    ap.add_argument("--energy", action="store_true", help="each phase's and the step's "
                    "joules (NVML's energy counter, two seconds each)")
    args = ap.parse_args()
    if args.energy and args.lin1_only:  # its table sets each phase against the whole step
        ap.error("--energy needs the whole step, which --lin1-only leaves out: give one")
    require_cuda("it times the step's phases on the device")
    meter = None
    if args.energy:
        meter, why_not = open_meter(gpu_id(torch.cuda.current_device()))
        if meter is None:
            sys.exit(f"error: --energy: {why_not}")
    peak_flops, peak_bw = peaks()
    print(f"# The step's roofline, {torch.cuda.get_device_name()} (peaks {peak_flops / 1e12:.0f} "
          f"TFLOP/s bf16 dense, {peak_bw / 1e12:.2f} TB/s), torch {torch.__version__}, "
          f"{args.loss}\n", flush=True)
    cfg = train.parse_config([])
    B, H, S = cfg.batch_size, cfg.hidden, cfg.image_size
    Fe, out = 256 * (S // 16) ** 2, cfg.max_boxes * 4
    lin1 = lin1_phases(B, Fe, H, meter)
    written = f"lin1's SGD wrote {lin1[-1]['sectors_written']:.1%} of its weight's 32-byte " \
        "sectors a call (--skip-unchanged-weight: the rest were unchanged)"
    if args.lin1_only:
        print(f"{table(lin1, peak_flops, peak_bw)}\n\n{written}", flush=True)
        return
    whole, model, images, step = step_ms(args)
    rows = lin1 + [trunk_phase(model, images, meter), *lin2_phases(B, H, out, meter),
                   small_sgd_phase(model, meter)]
    print(f"## The step's phases\n\n{table(rows, peak_flops, peak_bw)}\n\n"
          f"{floors(rows, peak_flops, peak_bw)}; the whole step (CUDA events, median of "
          f"30, one batch reused): **{whole:.2f} ms**; {written}\n", flush=True)
    if meter is not None:
        print(f"## Joules\n\n{energy_table(rows, step, meter)}\n", flush=True)


if __name__ == "__main__":
    main()
