"""The whole train step as one CUDA graph (--cuda-graph), for static-shape strategies:
eager steps first on a side stream (compiles, cuDNN's tuning, the momentum buffers), then
one step captured, then every step a copy into static tensors and a replay.
Its design in full: docs/design.md."""

import torch

from core.errors import InputError
from core.phases import phase


def copy_into(static, fresh):
    """Copies a batch's tensors into the static device tensors (from the host: H2D,
    asynchronous from pinned memory); the structure (a tensor or a tuple of tensors), the
    shapes and the dtypes must match (copy_ would cast another dtype without a word)."""
    if isinstance(static, torch.Tensor):
        if static.shape != fresh.shape:
            raise InputError(f"a CUDA graph replays fixed shapes: got {tuple(fresh.shape)}, "
                             f"captured {tuple(static.shape)}")
        if static.dtype != fresh.dtype:
            raise InputError(f"a CUDA graph replays fixed dtypes: got {fresh.dtype}, "
                             f"captured {static.dtype}")
        static.copy_(fresh, non_blocking=True)
        return
    for s, f in zip(static, fresh, strict=True):
        copy_into(s, f)


class GraphedStep:
    """step(i, host_images, host_targets) -> loss tensor (on the device).

    step_fn(images, targets) is the eager step (forward, loss, backward, optimizer; no
    host sync) and to_device moves a batch to the GPU; capture_at is the step captured
    (the eager steps are those before it)."""

    def __init__(self, step_fn, to_device, capture_at: int, phase=phase):
        if capture_at < 1:
            raise ValueError("a CUDA graph needs at least one eager step before its capture")
        self.step_fn, self.to_device, self.capture_at, self.phase = (
            step_fn, to_device, capture_at, phase)
        self.side = torch.cuda.Stream()
        self.graph = None
        self.static = None  # (images, targets) on the device, at the captured addresses
        self.loss = None    # the captured loss tensor, refreshed by each replay

    def step(self, i: int, images, targets) -> torch.Tensor:
        if i < self.capture_at:
            return self._eager(images, targets)
        if self.graph is None:
            return self._capture(images, targets)
        with self.phase("copy"):
            copy_into(self.static, (images, targets))
        with self.phase("graph"):
            self.graph.replay()
        return self.loss

    def _eager(self, images, targets) -> torch.Tensor:
        self.side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(self.side):
            with self.phase("copy"):
                batch = self.to_device((images, targets))
            loss = self.step_fn(*batch)
        torch.cuda.current_stream().wait_stream(self.side)
        return loss

    def _capture(self, images, targets) -> torch.Tensor:
        with self.phase("copy"):
            self.static = self.to_device((images, targets))
        torch.cuda.synchronize()  # host-device sync: once, before the capture
        self.graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.loss = self.step_fn(*self.static)
        with self.phase("graph"):
            self.graph.replay()  # the capture ran nothing: this is the step's work
        return self.loss


class GraphedLoss:
    """loss(pred, targets) -> scalar, the wrapped loss and its gradient as one CUDA graph.

    The step asks the loss for d loss / d pred alone (train.py's loss_backward), so the
    graph holds both: captured once, at the first call, then each call copies pred and the
    targets into the captured tensors, replays, and hands autograd the captured gradient
    (a _Replayed node: d loss / d pred times the incoming gradient, 1 in the step). A loss
    of ~100 small kernels, each a few microseconds of work behind a launch, becomes one
    launch and a few copies. Fixed shapes only: another shape is one error (copy_into).
    """

    def __init__(self, loss_fn, warmups: int = 2):
        self.loss_fn, self.warmups, self.graph = loss_fn, warmups, None

    def __call__(self, pred: torch.Tensor, targets) -> torch.Tensor:
        if self.graph is None:
            self._capture(pred, targets)
        with torch.no_grad():
            copy_into(self.pred, pred.detach())
            copy_into(self.targets, targets)
        self.graph.replay()
        return _Replayed.apply(pred, self.loss, self.grad)

    def _loss_and_grad(self):
        with torch.enable_grad():
            loss = self.loss_fn(self.pred, self.targets)
            (grad,) = torch.autograd.grad(loss, self.pred)
        return loss.detach(), grad

    def _capture(self, pred, targets) -> None:
        self.pred = pred.detach().clone().requires_grad_()
        self.targets = tuple(t.clone() for t in targets)
        # Warm-up calls on a side stream first (torch's rule for capture): whatever the
        # loss creates or tunes on its first call is not created inside the graph.
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(self.warmups):
                self._loss_and_grad()
        torch.cuda.current_stream().wait_stream(side)
        self.graph = torch.cuda.CUDAGraph()
        # host-device sync: torch.cuda.graph synchronizes as it starts, once, here.
        # thread_local: the loader's pin-memory thread allocates while we capture.
        with torch.cuda.graph(self.graph, capture_error_mode="thread_local"):
            self.loss, self.grad = self._loss_and_grad()


class _Replayed(torch.autograd.Function):
    """The replayed loss as an autograd node of pred: its gradient is the captured one.
    The loss is cloned (one 4-byte copy): the next replay overwrites the captured one
    while the step's caller may still read this step's."""

    @staticmethod
    def forward(ctx, pred, loss, grad):
        ctx.save_for_backward(grad)
        return loss.clone()

    @staticmethod
    def backward(ctx, grad_loss):
        (grad,) = ctx.saved_tensors
        return grad * grad_loss, None, None
