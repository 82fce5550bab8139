"""Under --parallel tp, the head (training/tensor_parallel.py: lin1 column-parallel, ReLU,
lin2 row-parallel) replayed as two CUDA graphs, forward and backward, where the eager head
is Python on every step and tp ranks were host-bound. It needs fixed shapes, parameters
updated in place and one capture at the first call; the same kernels, the same losses.
The design in full: docs/design.md, this module's section."""

import contextlib
import functools

from training.speedups.base import SpeedUp


class GraphedHead:
    """head(x) replayed: `head` is the model's eager head (lin1, ReLU, lin2); `slots()`
    names its parameters as (module, name) pairs, read at the first call (tp's shards
    replace the model's parameters after the speed-ups' transforms run). Captured there,
    replayed at every call of the same shape."""

    def __init__(self, head, slots, warmups: int = 2):
        self.head, self.slots, self.warmups = head, slots, warmups
        self.x = None  # the captured input, its output and gradients: set by _capture

    def __call__(self, x):
        if self.x is None:
            self._capture(x)
        if x.shape != self.x.shape or x.dtype != self.x.dtype:
            return self.head(x)  # a batch of another size (the last of a short epoch)
        return _replayed().apply(self, x, *self.weights)

    def _capture(self, x) -> None:
        import torch
        slots = self.slots()
        self.weights = tuple(module._parameters[name] for module, name in slots)
        # The graphs differentiate stand-ins: parameters on the same memory (the graphs
        # read every in-place update), each with a gradient accumulator of its own. A
        # parameter's own accumulator can be older than the capture and on the step's
        # stream (DDP keeps lin2's bias's): fed from the capture's stream, it made torch
        # warn of the streams' mismatch, and on the default stream it can break the
        # capture (torch's warning says so).
        stand_ins = tuple(torch.nn.Parameter(w.detach(), w.requires_grad)
                          for w in self.weights)
        self.x = x.detach().clone().requires_grad_(x.requires_grad)
        inputs = tuple(t for t in (self.x, *stand_ins) if t.requires_grad)
        current = torch.cuda.current_stream()
        # Warm-up calls on a side stream first (torch's rule for capture): cuBLAS's
        # handles and workspaces are made outside the graph.
        side = torch.cuda.Stream(priority=current.priority)
        side.wait_stream(current)
        with _standing_in(slots, stand_ins), _no_cast_cache(x.device.type):
            with torch.cuda.stream(side):
                for _ in range(self.warmups):
                    out = self.head(self.x)
                    torch.autograd.grad(out, inputs, torch.zeros_like(out))
            current.wait_stream(side)
            self.forward_graph = torch.cuda.CUDAGraph()
            self.backward_graph = torch.cuda.CUDAGraph()
            pool = torch.cuda.graph_pool_handle()
            # host-device sync: torch.cuda.graph synchronizes as it starts, once a capture.
            # thread_local: the loader's pin-memory thread allocates while we capture. The
            # capture stream has the step's priority, which its kernels keep on replay.
            with torch.cuda.graph(self.forward_graph, pool=pool, stream=side,
                                  capture_error_mode="thread_local"):
                out = self.head(self.x)
            self.grad_out = torch.empty_like(out)
            with torch.cuda.graph(self.backward_graph, pool=pool, stream=side,
                                  capture_error_mode="thread_local"):
                grads = iter(torch.autograd.grad(out, inputs, self.grad_out))
        self.out = out.detach()  # the capture's autograd graph is not needed again
        self.grads = tuple(next(grads) if t.requires_grad else None
                           for t in (self.x, *stand_ins))


@contextlib.contextmanager
def _standing_in(slots, stand_ins):
    """Each (module, name) slot's parameter replaced by its stand-in inside."""
    kept = [module._parameters[name] for module, name in slots]
    for (module, name), stand_in in zip(slots, stand_ins, strict=True):
        module._parameters[name] = stand_in
    try:
        yield
    finally:
        for (module, name), parameter in zip(slots, kept, strict=True):
            module._parameters[name] = parameter


def _no_cast_cache(device_type: str):
    """The caller's autocast without its cache: a cast cached during the capture would be
    a tensor the graph reads at an address the cache later frees."""
    import torch
    enabled = torch.is_autocast_enabled(device_type)
    return torch.autocast(device_type, dtype=torch.get_autocast_dtype(device_type),
                          enabled=enabled, cache_enabled=False)


@functools.cache
def _replayed():
    """The autograd function below, made once (no torch at this module's import)."""
    import torch

    class Replayed(torch.autograd.Function):
        """The head's output as an autograd node of x and the parameters: forward copies x
        in and replays; backward copies the gradient in, replays, and hands autograd the
        captured gradients. The output and gradients are the graphs' own tensors, read
        before the next replay overwrites them (the next step's head comes after this
        step's backward and update on the same stream)."""

        @staticmethod
        def forward(ctx, graphed, x, *weights):
            graphed.x.copy_(x)
            graphed.forward_graph.replay()
            ctx.graphed = graphed
            return graphed.out.detach()

        @staticmethod
        @torch.autograd.function.once_differentiable
        def backward(ctx, grad):
            graphed = ctx.graphed
            graphed.grad_out.copy_(grad)
            graphed.backward_graph.replay()
            return (None, *(g.detach() if g is not None else None for g in graphed.grads))

    return Replayed


def graph_the_head(model, build) -> None:
    model.head = GraphedHead(model.head, lambda: [
        (model.lin1, "weight"), (model.lin1, "bias"), (model.lin2, "weight"),
        (model.lin2, "bias")])


def refusal(asked, cuda: bool) -> str | None:
    if asked.design != "tp":
        return ("only --parallel tp's head runs eager on several GPUs; elsewhere it is "
                "compiled with the model")
    if asked.mode != "train":
        return "the graphs hold the head's backward too, which forward mode does not run"
    if not cuda:
        return "CUDA graphs need a CUDA GPU"
    if asked.wait < 1:
        return ("the head is captured at the first step (a device sync), which needs "
                "--wait 1 or more to stay out of the profiled steps")
    return None


SPEEDUP = SpeedUp(
    "graphed_head",
    "replay --parallel tp's head (lin1, ReLU, lin2 and their collectives) and its backward "
    "as two CUDA graphs: auto (the default: tp in train mode on a GPU, with --wait 1 or "
    "more), on, off",
    default="auto", gpu_only=True, several_ranks=True, refusal=refusal,
    model=graph_the_head)
