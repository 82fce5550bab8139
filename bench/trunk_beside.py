"""The trunk's kernels beside lin1's update, and beside what stands for each half of it.

The step runs lin1's shadow SGD on a low-priority stream beside the trunk's backward, and
the trunk's kernels slow there. This says what they wait on: the compiled trunk (forward
and backward) on a high-priority stream, alone and beside backgrounds on a low-priority
one: (update) the SGD as the step runs it; (copy) a device copy of as many bytes, HBM's
traffic and no arithmetic; (spin) FMAs in registers on every SM, room and no traffic.
Each trunk kernel's GPU ms a call (the profiler), the trunk's span (CUDA events), and one
update and one trunk call launched together against the HBM floor of their bytes.

Run on the device: python3 bench/trunk_beside.py [--loss kernel] [-- --backend cuda]
"""

import argparse
import statistics
import sys

import torch

sys.path.insert(0, ".")
from bench.needs_gpu import require_cuda  # noqa: E402
from bench.roofline import peaks, preset_step, sgd_bytes, sgd_update, trunk_call, trunk_counts  # noqa: E402
from bench.sharded_rank import cuda_ms  # noqa: E402

CALLS = 3  # profiled trunk calls a round, each inside its background
SPIN_BLOCK = 256  # a spin program's elements: 8 warps, as the SGD's programs


def spin_kernel():
    """A Triton kernel of FMAs in registers: it takes SMs and moves (almost) no bytes."""
    import triton
    import triton.language as tl

    @triton.jit
    def _spin(out_ptr, n_iter, BLOCK: tl.constexpr):
        x = tl.arange(0, BLOCK).to(tl.float32) * 1e-3 + tl.program_id(0)
        y = x + 1.0
        for _ in range(n_iter):
            x = x * 0.999 + y
            y = y * 0.999 - x * 1e-4
        # Stored so the loop is not removed: one float an element, once.
        tl.store(out_ptr + tl.program_id(0) * BLOCK + tl.arange(0, BLOCK), x + y)
    return _spin


def backgrounds(update, H: int, Fe: int, target_ms: float) -> dict:
    """name -> a call: the update as the step runs it, a copy of the update's 16 bytes an
    element (8 read, 8 written), and a spin tuned to last about target_ms."""
    src = torch.empty(H * Fe * 2, device="cuda")  # fp32: 8 bytes an element of lin1
    dst = torch.empty_like(src)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    # Many short programs (256 waves a call at 8 an SM), so that the trunk's high-priority
    # blocks wait little for an SM's slot: they share SMs, not wait for them.
    spin, programs = spin_kernel(), sms * 2048
    out = torch.empty(programs * SPIN_BLOCK, device="cuda")
    iters = 64
    once = cuda_ms(lambda: spin[(programs,)](out, iters, BLOCK=SPIN_BLOCK), reps=5)
    iters = max(1, round(iters * target_ms / once))
    return {"update": update, "copy": lambda: dst.copy_(src),
            "spin": lambda: spin[(programs,)](out, iters, BLOCK=SPIN_BLOCK)}


def kernels_of(fn) -> set[str]:
    """The names of the GPU work one call of fn runs (the profiler's keys)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()  # host-device sync: the call is done
    return {e.key for e in prof.key_averages() if e.device_time_total > 0}


def profiled(trunk, background, repeats: int) -> tuple[dict, float]:
    """(kernel name -> GPU ms a call, the trunk's median span in ms) of CALLS trunk calls
    on a high-priority stream, each launched after `repeats` background calls on a
    low-priority one, so that the background runs beside all of it. A kernel the
    background also runs is left out: its time would be both's."""
    from torch.profiler import ProfilerActivity, profile
    high, low = torch.cuda.Stream(priority=-1), torch.cuda.Stream(priority=0)
    theirs = kernels_of(background) if background is not None else set()
    spans = []
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            if background is not None:
                with torch.cuda.stream(low):
                    for _ in range(repeats):
                        background()
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            with torch.cuda.stream(high):
                start.record(high)
                trunk()
                end.record(high)
            spans.append((start, end))
            torch.cuda.synchronize()  # host-device sync: the background ends between calls
    per_call = {e.key: e.device_time_total / CALLS / 1e3 for e in prof.key_averages()
                if e.device_time_total > 0 and e.key not in theirs}
    return per_call, statistics.median(s.elapsed_time(e) for s, e in spans)


# (the trunk's, the update's) stream priorities in together(): lower is higher.
PRIORITIES = {"the trunk first (the step's)": (-1, 0), "the update first": (0, -1),
              "equal": (0, 0)}


def together(trunk, update, priorities: tuple[int, int], reps: int = 10) -> float:
    """The median ms from one launch of the update and one trunk call at the same moment,
    on streams of these priorities, until both have ended (CUDA events)."""
    trunk_stream, update_stream = (torch.cuda.Stream(priority=p) for p in priorities)
    here = torch.cuda.current_stream()
    pairs = []
    for _ in range(reps + 3):
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record(here)
        for stream, fn in ((update_stream, update), (trunk_stream, trunk)):
            stream.wait_event(start)
            with torch.cuda.stream(stream):
                fn()
            here.wait_stream(stream)
        end.record(here)
        pairs.append((start, end))
    torch.cuda.synchronize()  # host-device sync: once, after the timed calls
    return statistics.median(s.elapsed_time(e) for s, e in pairs[3:])


def table(rounds: list[dict], top: int) -> str:
    """Markdown: the trunk's `top` kernels (by their time alone) by background, each cell
    the range over the rounds. rounds: [{background -> (kernel -> ms, span ms)}]."""
    alone = rounds[0]["alone"][0]
    names = sorted(alone, key=lambda k: -alone[k])[:top]
    columns = list(rounds[0])

    def cell(background, kernel=None):
        got = [r[background][1] if kernel is None else r[background][0].get(kernel)
               for r in rounds]
        got = [g for g in got if g is not None]
        if not got:
            return "–"
        low, high = min(got), max(got)
        return f"{low:.3f}" if f"{low:.3f}" == f"{high:.3f}" else f"{low:.3f}–{high:.3f}"
    lines = ["| kernel (GPU ms a call) | " + " | ".join(columns) + " |",
             "|---|" + "---:|" * len(columns),
             "| the trunk's span (CUDA events) | " + " | ".join(cell(c) for c in columns) + " |"]
    lines += [f"| `{k[:60]}` | " + " | ".join(cell(c, k) for c in columns) + " |"
              for k in names]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--loss", default="kernel")
    ap.add_argument("--rounds", type=int, default=2, help="each background's profile, N times")
    ap.add_argument("--top", type=int, default=12, help="the trunk's N longest kernels")
    ap.add_argument("train_args", nargs="*", help="more train.py options, after --")
    args = ap.parse_args()
    if args.rounds < 1 or args.top < 1:
        ap.error("--rounds and --top must be at least 1")
    require_cuda("it times the trunk's kernels beside other work on the device")
    cfg, model, _, batch = preset_step(["--loss", args.loss, *args.train_args])
    trunk = trunk_call(model, batch[0])
    span = cuda_ms(trunk, reps=10)
    H, Fe = model.lin1.weight.shape
    update, weight = sgd_update(H, Fe)
    update_bytes, _ = sgd_bytes(update, weight)
    _, trunk_bytes = trunk_counts(batch[0].shape[0], batch[0].shape[-1])
    work = backgrounds(update, H, Fe, target_ms=span)
    alone = {name: cuda_ms(fn, reps=5) for name, fn in work.items()}
    both = {name: together(trunk, update, p) for name, p in PRIORITIES.items()}
    # Enough background calls to outlast the trunk slowed beside them (3x its span alone).
    repeats = {name: max(2, round(3 * span / ms)) for name, ms in alone.items()}
    print(f"# The trunk beside other work, {torch.cuda.get_device_name()}, torch "
          f"{torch.__version__}, {cfg.loss}, batch {cfg.batch_size}\n")
    print(f"trunk forward + backward alone: {span:.3f} ms (CUDA events, median of 10); "
          "each background alone, ms a call: "
          + ", ".join(f"{n} {ms:.3f} (x{repeats[n]} a trunk call)" for n, ms in alone.items())
          + "\n", flush=True)
    floor = (update_bytes + trunk_bytes) / peaks()[1] * 1e3
    print("one update and one trunk call launched together (CUDA events, median of 10): "
          + ", ".join(f"{n} {ms:.3f} ms" for n, ms in both.items())
          + f"; against {alone['update'] + span:.3f} one after the other; the HBM floor of "
          f"their bytes ({update_bytes / 1e9:.2f} GB the update's, at least "
          f"{trunk_bytes / 1e9:.2f} GB the trunk's): {floor:.3f} ms\n", flush=True)
    rounds = []
    for number in range(args.rounds):
        got = {"alone": profiled(trunk, None, 0)}
        got.update({n: profiled(trunk, fn, repeats[n]) for n, fn in work.items()})
        rounds.append(got)
        print(f"round {number + 1} of {args.rounds}: the trunk's span "
              + ", ".join(f"{n} {got[n][1]:.3f}" for n in got) + " ms", flush=True)
    print(f"\n{table(rounds, args.top)}")


if __name__ == "__main__":
    main()
