"""lin1's update beside the trunk: the shadow SGD (21.5 GB through HBM, ~7.2 ms at 3 TB/s)
forked onto a low-priority side stream from lin1's gradient hook and joined just before
lin1's next forward, while the step runs on a high-priority stream: the update fills what
the trunk's latency-bound kernels leave of the SMs and of HBM. The same kernel, the same
bits; auto leaves it off for the host-bound strategies; no CUDA graph. What reads lin1's
weight, master or momentum between steps calls model.lin1_update.join() first. The design
in full: docs/design.md, this module's section."""

from training.speedups.base import SpeedUp

# The designs under which lin1's gradient is whole when its hook fires: tp's is the global
# batch's on each rank by construction (tp2d's summed across hosts by an earlier hook of
# the same gradient, training/parallel.py); DDP and FSDP2 reduce it after.
WHOLE_GRADIENT = ("tp", "tp2d")
HIGH = -1  # the step's stream priority (lower is higher; 0, the default, the lowest)
_step_streams: dict = {}


def step_stream(on: bool, cuda: bool, many_runs: bool) -> None:
    """The current stream of the process, every run: a high-priority one where this is on,
    the default stream where it is off (a run of make compare after one with it on)."""
    if not cuda or not (on or _step_streams):  # off, and never on: nothing to undo
        return
    import torch
    device = torch.cuda.current_device()
    if on and device not in _step_streams:
        _step_streams[device] = torch.cuda.Stream(device, priority=HIGH)
    torch.cuda.set_stream(_step_streams[device] if on else torch.cuda.default_stream(device))


class SideUpdate:
    """lin1's update on its own stream: fork(launch, holds) where the gradient is ready,
    join() before anything reads what it writes. On a CPU the update runs in place."""

    def __init__(self, device):
        import torch
        self.cuda = device.type == "cuda"
        self.stream = torch.cuda.Stream(device, priority=0) if self.cuda else None
        self.done = None
        self.held = []       # tensors the side stream reads until the join (the gradient)
        self.handles = []    # the gradient hooks of the optimizer that installed them

    def fork(self, launch, holds) -> None:
        import torch
        if not self.cuda:
            launch()
            return
        self.stream.wait_stream(torch.cuda.current_stream())  # the gradient is written
        with torch.cuda.stream(self.stream):
            launch()
        self.done = torch.cuda.Event()
        self.done.record(self.stream)
        # zero_grad(set_to_none) drops the gradient while the side stream reads it: held
        # until the step's stream has waited, so the allocator cannot hand it out before.
        self.held.append(holds)

    def join(self) -> None:
        """The current stream waits for the update (a stream wait, no host sync)."""
        import torch
        if self.done is not None:
            torch.cuda.current_stream().wait_event(self.done)
            self.done = None
        self.held.clear()

    def install(self, optimizer) -> None:
        """The shadowed parameters' updates leave the optimizer's step for their gradient's
        hook (an optimizer without, --bf16-shadow off: nothing to move). A model kept
        between runs gets a new optimizer each run: the last one's hooks go first."""
        import weakref
        self.join()
        for handle in self.handles:
            handle.remove()
        self.handles = []
        if not hasattr(optimizer, "shadows"):
            return
        # The hook reaches the optimizer through a weak reference: a parameter's hooks are
        # held on the C++ side, where the garbage collector cannot see a cycle back to it
        # (parameter -> hook -> optimizer -> parameter); a strong one kept every model a
        # process built (a probe building one a run, as make ladder does, ran out of GPU
        # memory at the eighth).
        ref = weakref.ref(optimizer)
        self.handles = [param.register_post_accumulate_grad_hook(
            lambda p: self.on_gradient(ref, p)) for param, _ in optimizer.shadows]
        optimizer.updated_elsewhere = self

    def on_gradient(self, optimizer_ref, param) -> None:
        optimizer = optimizer_ref()
        if optimizer is not None:
            self.fork(lambda: optimizer.update(param), param.grad)


def join_before_head(model, build) -> None:
    import types

    import torch
    model.lin1_update = SideUpdate(model.lin1.weight.device)
    join = torch.compiler.disable(model.lin1_update.join)  # the graph break
    head = model.head

    def head_after_update(self, x):
        join()
        return head(x)
    model.head = types.MethodType(head_after_update, model)
    model.register_state_dict_pre_hook(lambda *_: model.lin1_update.join())


def update_in_backward(model, make, build):
    def make_beside(params):
        optimizer = make(params)
        model.lin1_update.install(optimizer)
        return optimizer
    return make_beside


def refusal(asked, cuda: bool) -> str | None:
    from training.ranks import from_env
    if from_env().world > 1 and asked.design not in WHOLE_GRADIENT:
        return ("on several ranks under ddp or zero lin1's gradient is reduced after its "
                "hook has fired; tp and tp2d only")
    if asked["cuda_graph"] == "on":
        return ("a CUDA graph holds one step, and this update runs on into the next "
                "step's forward")
    return None


def host_bound(asked) -> str | None:
    """Why auto leaves it off for this run's strategy, or None."""
    from core.names import HOST_BOUND
    if asked.loss in HOST_BOUND:
        return (f"the {asked.loss} strategy is host-bound: the update beside the trunk saves "
                "GPU time its steps do not wait for, and cost nested 4-24 % of its epoch's "
                "rate; --lin1-update-beside-trunk on to have it anyway")
    return None


SPEEDUP = SpeedUp(
    "lin1_update_beside_trunk",
    "lin1's update (--bf16-shadow's) on a low-priority side stream from its gradient's "
    "hook, beside the trunk's backward and the next forward on the step's high-priority "
    "stream: auto (one GPU or --parallel tp/tp2d, no CUDA graph, not the host-bound loop, "
    "concat, nested), on, off",
    default="auto", gpu_only=True, refusal=refusal, auto_off=host_bound,
    model=join_before_head,
    optimizer=update_in_backward, process=step_stream,
    idle=lambda asked, on: None if on["bf16_shadow"] and asked.mode == "train" else
    "it moves --bf16-shadow's update in train mode, which is off")
