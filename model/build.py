"""Builds the model of a run, and keeps it between the runs of one process (make compare).

Built on the device: initialising the 1.07 B parameters of the full model on the host took
15 s on 2 cores (then a 4.3 GB copy), every run. With reuse, a later run with the same
shape, seed and transform gets the same model back with its initial parameters restored
from pinned host memory (4.3 GB), so torch.compile's work (its guards hold for the same
module) and CUDA's start-up are paid once per process. The host copy keeps the GPU's peak
memory what a fresh process would see.
"""

import gc

import torch

from model.boxnet import BoxNet

# One model kept between the runs of a process: its key, the model, what runs it
# (compiled or not), and its initial parameters on the host.
_kept: dict = {}


def build_model(image_size: int, capacity: int, hidden: int, compile_model: bool,
                seed: int, device: torch.device, reuse: bool = False, transform=None,
                wrap=None, wrap_key=None):
    """(model, runner): BoxNet initialised from seed, transform(model) applied in place (the
    step's speed-ups, training/speedups/; transform.key says which, for reuse), then
    runner = torch.compile(wrap(model)) or wrap(model), where wrap (DDP on several ranks,
    training/ddp.py; wrap_key says how it wraps) comes before compiling, so that the
    compiler sees DDP's buckets. A transform that leaves a part torch.compile cannot
    trace sets model.compile_whole = False: then only flat_features is compiled."""
    key = (image_size, capacity, hidden, compile_model, seed, str(device),
           getattr(transform, "key", None), wrap_key)
    kept = reuse and _kept.get("key") == key
    if not kept:
        if compile_model and reuse and _kept:
            # Another model replaces the kept one, so Dynamo forgets the frames it compiled
            # for the models before: make ladder builds one a rung in one process, each a
            # compile of the same BoxNet.forward, and past 8 of a frame (its
            # recompile_limit) Dynamo runs the frame eagerly with only a warning. A ladder
            # of ten tuned rungs ran its ninth eager.
            torch._dynamo.reset()
        # Dropped before the collection below: a model in a reference cycle (lin1's update
        # beside the trunk rebinds model.head to a method of the model) is freed only by
        # it, and make ladder's rung after one counted it in its own peak (21.4 GB against
        # 14.7 a rung before, aa9cb7d on the H100).
        forget_kept_model()
    # What earlier runs of this process (make compare) left is freed and uncached first:
    # each run's peak memory is its own.
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    torch.manual_seed(seed)
    if kept:
        model = _kept["model"]
        if device.type == "cuda":
            # host-device sync, once a run: the kept model's last step may still run on
            # another stream (--lin1-update-beside-trunk) when its parameters are restored.
            torch.cuda.synchronize(device)
        with torch.no_grad():
            for p, p0 in zip(_state(model), _kept["initial"]):
                _rows(p).copy_(p0, non_blocking=True)
                p.grad = None
        return model, _kept["runner"]
    with device:
        model = BoxNet(image_size, capacity, hidden)
        if transform is not None:
            transform(model)
    wrapped = wrap(model) if wrap else model
    whole = getattr(model, "compile_whole", True)
    runner = torch.compile(wrapped) if compile_model and whole else wrapped
    if compile_model and not whole:
        model.flat_features = torch.compile(model.flat_features)  # the head runs eager
    if reuse:
        pin = device.type == "cuda"
        initial = [_rows(p).detach().to("cpu", copy=True).pin_memory() if pin else
                   _rows(p).detach().clone() for p in _state(model)]
        _kept.update(key=key, model=model, runner=runner, initial=initial)
    return model, runner


def _state(model) -> list:
    """What a run changes: the parameters, and the buffers (lin1's fp32 master weights
    under the bf16 shadow)."""
    return list(model.parameters()) + list(model.buffers())


def _rows(tensor):
    """A sharded tensor's part on this rank (a DTensor's local rows under --parallel zero
    or tp), else the tensor: a DTensor cannot be pinned (aten.is_pinned has no sharding
    rule), and this rank's rows are all that it restores."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def kept_model():
    """The model kept for reuse, or None."""
    return _kept.get("model")


def forget_kept_model() -> None:
    _kept.clear()
