"""How far torch.nested and torch.compile go with the nested strategy's loss
(losses/nested.py) on this machine's torch: which jagged ops have a backward, what
torch.nested.narrow's view of the padded predictions does; torch.compile fullgraph or
not, over batches whose box count N changes (the compiles, graph breaks and the first
error); then, where it compiles, the host and stream time of a call eager and compiled
at the workload's point (batch 1024, M = 256, sigma 3).

    python3 bench/nested_compile.py            # prints a Markdown report
"""

import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import losses  # noqa: E402
from studies.sweep_point import predictions, samples  # noqa: E402


def _batches(device, n: int, batch: int, capacity: int):
    strategy = losses.get("nested", capacity=capacity)
    for k in range(n):
        _, targets = strategy.collate(samples(batch, capacity, 3.0, seed=k))
        yield tuple(t.to(device) for t in targets)


def _outcome(fn) -> str:
    try:
        fn()
        return "works"
    except Exception as exc:  # the finding is the error itself
        first = str(exc).strip().splitlines()
        return f"fails: {type(exc).__name__}: {first[0][:160] if first else ''}"


def jagged_backward(device) -> list[str]:
    """Each op the loss could use on a jagged [3, j, 4] tensor, forward and backward."""
    offsets = torch.tensor([0, 2, 2, 5], device=device)
    ops = {"x[..., 0] (select)": lambda x: x[..., 0],
           "x.unbind(-1)": lambda x: x.unbind(-1)[0],
           "x.narrow(-1, 0, 1)": lambda x: x.narrow(-1, 0, 1),
           "torch.minimum": lambda x: torch.minimum(x, x * 0.5),
           "torch.maximum": lambda x: torch.maximum(x, x * 0.5),
           "clamp(min=)": lambda x: x.clamp(min=0.3),
           "torch.where": lambda x: torch.where(x > 0.5, x, 0.0),
           "arithmetic": lambda x: (x * 2 - 1) / (x + 1),
           ".to(float64)": lambda x: x.to(torch.float64)}
    lines = []
    for name, op in ops.items():
        values = torch.rand(5, 4, device=device, requires_grad=True)

        def run(op=op, values=values):
            x = torch.nested.nested_tensor_from_jagged(values, offsets)
            op(x).values().sum().backward()
        lines.append(f"- {name}: {_outcome(run)}")
    return lines


def narrowed_view(device) -> list[str]:
    """torch.nested.narrow over padded predictions [3, 6, 4] with counts 2, 0, 5."""
    counts = torch.tensor([2, 0, 5], device=device)
    offsets = torch.tensor([0, 2, 2, 7], device=device)
    targets = torch.nested.nested_tensor_from_jagged(torch.rand(7, 4, device=device), offsets)
    pred = torch.rand(3, 6, 4, device=device, requires_grad=True)

    def view():
        return torch.nested.narrow(pred, 1, torch.zeros_like(counts), counts,
                                   layout=torch.jagged)

    def summed():
        pred.grad = None
        view().sum().backward()
        padding = int((pred.grad[0, 2:] != 0).sum())  # host-device sync
        if padding:
            raise AssertionError(f"the gradient reaches {padding} padding values of "
                                 "sample 0: sum() covers the padding")
    return [f"- narrow, then minus the targets' jagged tensor: "
            f"{_outcome(lambda: view() - targets)}",
            f"- narrow, .contiguous(), backward: "
            f"{_outcome(lambda: view().contiguous().values().sum().backward())}",
            f"- narrow, .sum(), backward reaches only the valid slots: {_outcome(summed)}"]


def try_compile(device, fullgraph: bool, dynamic) -> str:
    """One line: whether three batches of different N compile and match eager."""
    from torch._dynamo.utils import counters
    torch._dynamo.reset()
    counters.clear()
    loss_fn = losses.get("nested").loss
    compiled = torch.compile(loss_fn, fullgraph=fullgraph, dynamic=dynamic)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    try:
        worst = 0.0
        for k, targets in enumerate(_batches(device, 3, 64, 256)):
            grads = []
            for fn in (loss_fn, compiled):
                pred = predictions(64, 256, device, dtype, seed=k)
                fn(pred, targets).backward()
                grads.append(pred.grad.float())
            worst = max(worst, float((grads[0] - grads[1]).abs().max()))  # host-device sync
        breaks = sum(counters["graph_break"].values())
        return (f"compiles: {counters['stats']['unique_graphs']} graph(s), {breaks} graph "
                f"break(s), max |grad difference| {worst:.2g}")
    except Exception as exc:  # the finding is the error itself
        first = str(exc).strip().splitlines()
        return f"fails: {type(exc).__name__}: {first[0][:300] if first else ''}"


def _time(fn, device, calls: int = 20) -> tuple[float, float]:
    """(median host ms to issue a call, GPU ms a call by CUDA events)."""
    host = []
    start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
    fn()
    torch.cuda.synchronize()  # host-device sync: outside the timed calls
    start.record()
    for _ in range(calls):
        t0 = time.perf_counter()
        fn()
        host.append((time.perf_counter() - t0) * 1e3)
    end.record()
    torch.cuda.synchronize()  # host-device sync: read the events
    return statistics.median(host), start.elapsed_time(end) / calls


def main() -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print(f"# torch.nested, torch.compile and the nested loss: torch {torch.__version__}, "
          f"{device}\n")
    print("## Jagged ops with a backward\n")
    print("\n".join(jagged_backward(device)) + "\n")
    print("## torch.nested.narrow over the padded predictions\n")
    print("\n".join(narrowed_view(device)) + "\n")
    print("## torch.compile over three batches of different N\n")
    results = {}
    for fullgraph in (True, False):
        for dynamic in (True, None):
            line = try_compile(device, fullgraph, dynamic)
            results[(fullgraph, dynamic)] = line
            print(f"- fullgraph={fullgraph}, dynamic={dynamic}: {line}", flush=True)
    if device.type != "cuda":
        return 0
    targets = next(_batches(device, 1, 1024, 256))
    pred = predictions(1024, 256, device, torch.bfloat16, seed=0)
    eager = losses.get("nested").loss
    print("\nbatch 1024, M 256, sigma 3, forward + backward, median of 20 calls:\n")
    for label, fn in (("eager", eager), ("compiled", torch.compile(eager, dynamic=True))):
        if label == "compiled" and not results[(False, True)].startswith("compiles"):
            print(f"- compiled: not timed ({results[(False, True)]})")
            continue

        def call(fn=fn):
            pred.grad = None
            fn(pred, targets).backward()
        host, gpu = _time(call, device)
        print(f"- {label}: host {host:.3f} ms a call, stream {gpu:.3f} ms a call")
    return 0


if __name__ == "__main__":
    sys.exit(main())
