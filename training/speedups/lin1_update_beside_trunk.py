"""lin1's update beside the trunk: the shadow SGD (21.5 GB through HBM, ~7.2 ms at 3 TB/s)
forked onto a low-priority side stream as soon as lin1's gradient is ready, and joined just
before lin1's next forward, while the step itself runs on a high-priority stream. The update
then fills what the trunk's backward, the other parameters' update and the next step's
trunk forward leave of the SMs: kernels that are latency-bound and leave most of HBM's
bandwidth idle.

Where, in the step:
    forward    trunk (graph 1) -> join: the step's stream waits for the side stream ->
               head (graph 2)
    backward   head's backward (lin1's dX and dW GEMMs) -> lin1's gradient accumulated ->
               hook: fork the update -> trunk's backward
    optimizer  every other parameter's SGD; lin1's is already on its way
The join is a call the compiler does not trace (a graph break), so the model compiles as
two graphs, the trunk's and the head's; autograd accumulates lin1's gradient (the hook
fires) before it starts the trunk's backward.

Why the priorities: the block scheduler gives an SM's freed room to the higher-priority
stream's waiting blocks first. With the step high and the update low, the update's short
blocks (kernels/lin1/shadow_sgd.py's, one a 4096 elements) take only room that no trunk
block is waiting for, and a trunk kernel whose blocks need a whole SM (cuDNN's input
gradient of the fourth block) waits for some of them to end, not for the whole update.
Measured both ways in results/toward-20ms.md: at equal priority, or with a persistent
update, the trunk's kernels waited and the step was slower.

auto leaves it off for the host-bound strategies (loop, concat, nested): it saves GPU
time they do not need, and nested's epoch ran slower with it (docs/speedups.md,
results/step.md). `on` still turns it on there.

Each element's update is the same kernel's: the same bits, the same losses. What reads
lin1's weight, master or momentum between steps other than the model's forward calls
model.lin1_update.join() first (the state dict does it itself). One GPU, or several under
tp or tp2d (each rank's rows of lin1 updated beside its trunk); no CUDA graph: a graph of
one step cannot hold work that runs on into the next.
"""

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
