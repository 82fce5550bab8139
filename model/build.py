"""Builds the model of a run, and keeps it between the runs of one process (make compare).

Built on the device: initialising the 1.07 B parameters of the full model on the host took
15 s on 2 cores (then a 4.3 GB copy), every run. With reuse, a later run with the same
shape and seed gets the same model back with its initial parameters restored from pinned
host memory (4.3 GB, ~0.2 s), so torch.compile's work (its guards hold for the same
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
                seed: int, device: torch.device, reuse: bool = False,
                triton_first_block: bool = False, channels_last: bool = False,
                block_dtype: torch.dtype = torch.float32, bf16_shadow: bool = False,
                triton_second_block: bool = False, update_in_gemm: bool = False,
                triton_pool: bool = False, triton_conv_pool: bool = False,
                triton_conv_pool_bwd: bool = False, wrap=None, wrap_key=None):
    """(model, runner) initialised from seed; runner is torch.compile(wrap(model)) or
    wrap(model), where wrap (DDP on several ranks, training/ddp.py; wrap_key says how it
    wraps) is applied before compiling, so that the compiler sees DDP's buckets.
    The Triton blocks and channels_last (training/speedups.py) change how the model
    runs, not its parameters: the same seed gives the same initial weights with either."""
    key = (image_size, capacity, hidden, compile_model, seed, str(device), triton_first_block,
           channels_last, block_dtype, bf16_shadow, triton_second_block, update_in_gemm,
           triton_pool, triton_conv_pool, triton_conv_pool_bwd, wrap_key)
    if device.type == "cuda":
        # What earlier runs of this process (make compare) left is freed and uncached
        # first: each run's peak memory is its own.
        gc.collect()
        torch.cuda.empty_cache()
    torch.manual_seed(seed)
    if reuse and _kept.get("key") == key:
        model = _kept["model"]
        with torch.no_grad():
            for p, p0 in zip(_state(model), _kept["initial"]):
                p.copy_(p0, non_blocking=True)
                p.grad = None
        return model, _kept["runner"]
    forget_kept_model()
    with device:
        model = BoxNet(image_size, capacity, hidden, triton_first_block, channels_last,
                       block_dtype, bf16_shadow, triton_second_block, update_in_gemm,
                       triton_pool, triton_conv_pool, triton_conv_pool_bwd)
    wrapped = wrap(model) if wrap else model
    runner = torch.compile(wrapped) if compile_model and model.compile_whole else wrapped
    if compile_model and not model.compile_whole:
        # the rest runs eager (--parallel tp, --update-in-gemm)
        model.flat_features = torch.compile(model.flat_features)
    if reuse:
        pin = device.type == "cuda"
        initial = [p.detach().to("cpu", copy=True).pin_memory() if pin else
                   p.detach().clone() for p in _state(model)]
        _kept.update(key=key, model=model, runner=runner, initial=initial)
    return model, runner


def _state(model) -> list:
    """What a run changes: the parameters, and the buffers (--bf16-shadow's fp32 master)."""
    return list(model.parameters()) + list(model.buffers())


def kept_model():
    """The model kept for reuse, or None."""
    return _kept.get("model")


def forget_kept_model() -> None:
    _kept.clear()
