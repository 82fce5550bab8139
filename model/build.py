"""Builds the model of a run on the device (the host is slow to initialise 1.07 B
parameters), and keeps it between the runs of one process (make compare): a later run of
the same shape, seed and transform gets it back with its initial parameters restored from
pinned host memory, so torch.compile's work is paid once a process and the GPU's peak
memory stays what a fresh process would see."""

import gc

import torch

from model.boxnet import BoxNet

# One model kept between the runs of a process: its key, the model, what runs it
# (compiled or not), and its initial parameters on the host.
_kept: dict = {}


def build_model(image_size: int, capacity: int, hidden: int, compile_model: bool,
                seed: int, device: torch.device, reuse: bool = False, transform=None,
                wrap=None, wrap_key=None):
    """(model, runner): BoxNet from seed, transform(model) in place (the speed-ups), then
    runner = torch.compile(wrap(model)) or wrap(model): wrapped (DDP) before compiling so
    the compiler sees DDP's buckets. model.compile_whole = False (a part the compiler
    cannot trace) compiles only flat_features."""
    key = (image_size, capacity, hidden, compile_model, seed, str(device),
           getattr(transform, "key", None), wrap_key)
    kept = reuse and _kept.get("key") == key
    if not kept:
        if compile_model and reuse and _kept:
            # Dynamo forgets the replaced models' frames: past its recompile_limit (8) of
            # one frame it runs it eagerly, with only a warning (make ladder's ninth rung).
            torch._dynamo.reset()
        # Dropped before the collection below, which alone frees a model in a reference
        # cycle (lin1's update beside the trunk): else the next run counts it in its peak.
        forget_kept_model()
    # Each run's peak memory is its own: earlier runs' leftovers freed and uncached.
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    torch.manual_seed(seed)
    if kept:
        model = _kept["model"]
        if device.type == "cuda":
            # host-device sync, once a run: the kept model's last step may still run on
            # another stream when its parameters are restored.
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
    """A DTensor's local rows (--parallel zero or tp), else the tensor: a DTensor cannot
    be pinned, and this rank's rows are all that it restores."""
    to_local = getattr(tensor, "to_local", None)
    return to_local() if to_local is not None else tensor


def kept_model():
    """The model kept for reuse, or None."""
    return _kept.get("model")


def forget_kept_model() -> None:
    _kept.clear()
