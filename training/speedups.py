"""The training step's speed-ups: each a Config switch, each off under --baseline.

    cudnn_benchmark  cuDNN times its convolution algorithms on the first call of each shape
                     and keeps the fastest (its heuristics pick slow kernels for the small-
                     channel convolutions). The tuning runs in the profiler's unprofiled
                     first step. GPU only.
    fused_sgd        SGD with momentum as one fused kernel per parameter group instead of
                     the default foreach kernels: each byte of parameter, gradient and
                     momentum read and written once.
    channels_last    the convolutions' weights and activations in NHWC, the layout cuDNN's
                     bf16 tensor-core kernels use (NCHW costs transposes or slower kernels).
    triton_first_block
                     the first block (uint8 -> /255 -> conv 1->4 -> max-pool -> ReLU) as
                     one Triton kernel forward and one backward (kernels/
                     triton_first_block.py): cuDNN has no good kernel for one input
                     channel. Off in the CPU preset (Triton's interpreter is slow there).
    triton_second_block
                     the second block (conv 4->16 -> max-pool -> ReLU) as one Triton
                     kernel forward (four tensor-core dots per pixel block: the conv
                     output never leaves registers) and two backward (kernels/
                     triton_second_block.py): cuDNN's kernels for 4 input channels waste
                     most of their tiles. Off in the CPU preset, as the first block.
    triton_pool      the third and fourth blocks' bias, max-pool and ReLU as one Triton
                     kernel forward and one backward around cuDNN's conv, which runs
                     without its bias (kernels/triton_pool.py): Inductor added the bias
                     over the full-resolution output in a pass of its own and wrote the
                     pool's gradient at a third of HBM's rate. The compiled step's
                     forward at the GPU preset, bit for bit. Off in the CPU preset, as the
                     blocks.
    triton_conv_pool the third block's forward (conv 16->64, bias, max-pool, ReLU, the
                     pool's code) as one persistent Triton kernel of tensor-core dots
                     (kernels/triton_conv_pool.py): cuDNN's conv wrote its 537 MB
                     full-resolution output at ~1.1 TB/s for the pool to read back. The
                     backward is --triton-pool's and cuDNN's, as before, unless
                     triton_conv_pool_bwd. Off in the CPU preset, as the blocks.
    triton_conv_pool_bwd  that block's backward from its pooled gradient and the forward's
                     code in two Triton kernels (kernels/triton_conv_pool_bwd.py): the
                     pool's backward wrote the 537 MB full-resolution gradient, which
                     cuDNN's input and weight gradients read back. Only with
                     triton_conv_pool (whose code it reads): off where that is off.
    bf16_shadow      lin1's weight kept as a bf16 parameter with fp32 master weights that
                     one Triton kernel updates together with the momentum, reading the bf16
                     gradient (kernels/triton_shadow_sgd.py): two 1.07 B-element casts a
                     step fewer. Needs bf16 autocast on a GPU.
    update_in_gemm   lin1's shadow SGD in the epilogue of its weight-gradient GEMM, one
                     Triton kernel in the optimizer's step (kernels/triton_dw_update.py):
                     the update's memory traffic runs under the GEMM's tensor-core work
                     and the 2.1 GB bf16 gradient is never written. Needs bf16_shadow; one
                     rank (a gradient reduced across ranks must exist before the update).
                     Off by default: on the H100 the kernel took what the GEMM and the SGD
                     took apart (9.85 against 9.86 ms), and the step 0.14 ms more
                     (results/step.md).
    cuda_graph       the whole step (forward, loss, backward, optimizer) captured once and
                     replayed: one launch a step instead of hundreds. Static-shape
                     strategies in train mode only (training/cuda_graph.py).

Nothing here imports torch at import time (train.py --help works without it).
What each changes, and by how much, is make ladder's table (results/step.md). The names and
their order are core.names.SPEEDUPS; adding one is a Config field, a line here, and its
use where the step is built.
"""

from core.errors import UserError
from core.names import CHOICE_SPEEDUPS, GPU_ONLY_SPEEDUPS, PACKED, RAGGED, SPEEDUPS

HELP = {
    "cudnn_benchmark": "cuDNN autotunes each convolution in the first (unprofiled) step "
                       "(GPU only)",
    "fused_sgd": "one fused SGD-with-momentum kernel instead of foreach kernels",
    "channels_last": "NHWC convolutions (cuDNN's tensor-core layout)",
    "triton_first_block": "the first conv -> max-pool -> ReLU block as one Triton kernel "
                          "forward and one backward",
    "triton_second_block": "the second conv -> max-pool -> ReLU block as Triton kernels "
                           "(one forward, two backward)",
    "triton_pool": "the third and fourth blocks' bias, max-pool and ReLU as one Triton "
                   "kernel forward and one backward around cuDNN's bias-free conv",
    "triton_conv_pool": "the third block's conv, bias, max-pool and ReLU forward as one "
                        "Triton kernel (its backward: --triton-conv-pool-bwd's, or the "
                        "pool's and cuDNN's)",
    "triton_conv_pool_bwd": "with --triton-conv-pool, that block's backward as two Triton "
                            "kernels from the pooled gradient and the pool's code",
    "bf16_shadow": "lin1's weight as bf16 with fp32 master weights, updated by one Triton "
                   "kernel that reads the bf16 gradient (GPU, with --amp)",
    "update_in_gemm": "lin1's shadow SGD in the epilogue of its weight-gradient GEMM: auto "
                      "(where it can: --bf16-shadow on one GPU, train mode), on, off",
    "cuda_graph": "replay the whole train step as one CUDA graph: auto (where it can: a "
                  "static-shape strategy in train mode on a GPU), on, off",
}
assert tuple(HELP) == SPEEDUPS, "core.names.SPEEDUPS and HELP must agree"


def baseline_values() -> dict:
    """Every speed-up off: the step as the original ran it."""
    return {name: ("off" if name in CHOICE_SPEEDUPS else False) for name in SPEEDUPS}


def graph_refusal(cfg, cuda: bool) -> str | None:
    """Why this run's step cannot be a CUDA graph, or None if it can."""
    loss, mode = cfg.loss, cfg.mode
    if loss in RAGGED:
        return (f"the {loss} strategy's targets are ragged (their shapes change every "
                "batch), so its step cannot be captured as a CUDA graph")
    if loss in PACKED:
        return (f"the {loss} strategy's targets are packed ([boxes, 4]: the number of "
                "boxes changes every batch), so its step cannot be captured as a CUDA graph")
    if mode != "train":
        return ("forward mode closes each phase with a device sync, which a CUDA graph "
                "cannot hold")
    if not cuda:
        return "CUDA graphs need a CUDA GPU"
    from training.ranks import from_env
    if from_env().distributed:
        return ("a step with DDP's all-reduces is not captured as a CUDA graph here (one "
                "GPU only)")
    if cfg.wait < 2:
        return ("a CUDA graph needs --wait 2 or more: one eager step to compile and tune, "
                "one to capture, before the profiler records")
    return None


def gemm_update_refusal(cfg, cuda: bool) -> str | None:
    """Why lin1's update cannot run in its weight-gradient GEMM in this run, or None."""
    from training.ranks import from_env
    if not (cuda and cfg.amp and cfg.bf16_shadow):
        return ("it updates --bf16-shadow's fp32 master weights and momentum, which need "
                "bf16 autocast on a CUDA GPU (--amp)")
    if cfg.mode != "train":
        return "forward mode runs no update"
    if from_env().distributed:
        return ({"ddp": "with --parallel ddp each rank's weight gradient is all-reduced "
                        "before the update, so the GEMM that makes it cannot update",
                 "zero": "with --parallel zero lin1's gradient is reduce-scattered before "
                         "a shard is updated, so the GEMM that makes it cannot update",
                 "tp": "with --parallel tp lin1 is a sharded DTensor layer, which the "
                       "GEMM's update is not built for",
                 "tp2d": "with --parallel tp2d lin1's gradient is all-reduced across the "
                         "hosts before the update, so the GEMM that makes it cannot "
                         "update"}[cfg.parallel])
    return None


REFUSALS = {"update_in_gemm": gemm_update_refusal, "cuda_graph": graph_refusal}


def check(cfg, cuda: bool) -> None:
    """A GPU-only speed-up asked for without a GPU, or a speed-up asked for (on) where it
    cannot apply: one line, before anything is written."""
    for name in GPU_ONLY_SPEEDUPS:
        value = getattr(cfg, name)
        flag = "--" + name.replace("_", "-")
        if name in CHOICE_SPEEDUPS:
            if value not in ("auto", "on", "off"):
                raise UserError(f"{flag} takes auto, on or off, not {value!r}")
            reason = REFUSALS[name](cfg, cuda) if value == "on" else None
            if reason:
                raise UserError(f"{flag} on: {reason}; use {flag} off or auto")
        elif name == "bf16_shadow":
            if value and not (cuda and cfg.amp):
                raise UserError("--bf16-shadow needs bf16 autocast on a CUDA GPU (--amp); "
                                "leave it out (or --no-bf16-shadow) here")
        elif value and not cuda:
            raise UserError(f"{flag} needs a CUDA GPU; leave it out (or --no-"
                            f"{flag[2:]}) on this machine")


def resolve(cfg, cuda: bool) -> dict:
    """What this run actually uses: each switch on or off, and for the auto ones (the
    CUDA graph, the update in the GEMM) the reason each is off. Recorded in summary.json."""
    used = {name: bool(getattr(cfg, name)) for name in SPEEDUPS if name not in CHOICE_SPEEDUPS}
    if cfg.mode == "forward":
        used["fused_sgd"] = False  # no optimizer step runs in forward mode
    # The backward kernels read the fused forward's code: nothing to do without it.
    used["triton_conv_pool_bwd"] = used["triton_conv_pool_bwd"] and used["triton_conv_pool"]
    reasons = {}
    for name in CHOICE_SPEEDUPS:
        reason = "turned off" if getattr(cfg, name) == "off" else REFUSALS[name](cfg, cuda)
        used[name] = reason is None
        reasons[name] = reason
    return {"on": {name: used[name] for name in SPEEDUPS},
            "cuda_graph_off_because": reasons["cuda_graph"],
            "update_in_gemm_off_because": reasons["update_in_gemm"]}


# The cudnn_benchmark value of the first CUDA run of this process (see below).
_cudnn_choice: list[bool] = []


def apply_backend_flags(used: dict, cuda: bool, many_runs: bool) -> None:
    """Process-wide flags, set for every run. many_runs: this process measures several
    runs side by side (make compare, make ladder), where the rule below holds.

    cuDNN keeps the algorithm it first chose for a convolution (shapes, layout, dtype) for
    the life of the process, and its cache does not look at the benchmark flag: after a run
    with heuristics, a run with autotuning would get the heuristics' choices (measured: no
    change at all, where a fresh process saves tens of ms). So one process keeps one
    value; a run asking for the other one is refused."""
    import torch
    if cuda and many_runs:
        if _cudnn_choice and _cudnn_choice[0] != used["cudnn_benchmark"]:
            raise UserError(
                f"this process already ran with cudnn_benchmark={_cudnn_choice[0]}, and cuDNN "
                "keeps the algorithms it chose then: a run with "
                f"cudnn_benchmark={used['cudnn_benchmark']} must start in a new process")
        _cudnn_choice[:] = [used["cudnn_benchmark"]]
    torch.backends.cudnn.benchmark = used["cudnn_benchmark"]


def build(cfg, used: dict, device, reuse: bool, wrap=None, wrap_key=None):
    """(model, runner, optimizer) of a run, with the speed-ups that shape them: the first
    and second blocks' kernels and the first's output dtype (autocast's), channels_last,
    the bf16 shadow. wrap: DDP on several ranks (model/build.py)."""
    import torch

    from model import build_model
    autocast_on = cfg.amp and device.type == "cuda"
    model, runner = build_model(cfg.image_size, cfg.max_boxes, cfg.hidden, cfg.compile,
                                cfg.seed, device, reuse,
                                triton_first_block=used["triton_first_block"],
                                channels_last=used["channels_last"],
                                block_dtype=torch.bfloat16 if autocast_on else torch.float32,
                                bf16_shadow=used["bf16_shadow"],
                                triton_second_block=used["triton_second_block"],
                                triton_pool=used["triton_pool"],
                                triton_conv_pool=used["triton_conv_pool"],
                                triton_conv_pool_bwd=used["triton_conv_pool_bwd"],
                                update_in_gemm=used["update_in_gemm"],
                                wrap=wrap, wrap_key=wrap_key)
    return model, runner, make_optimizer(model, cfg.lr, used)


def make_optimizer(model, lr: float, used: dict):
    """SGD with momentum 0.9: fused, or torch's default (foreach on CUDA); with bf16_shadow
    the shadowed weight's step is its own kernel (training/bf16_shadow.py)."""
    from training.bf16_shadow import SGDWithShadow, momentum_sgd
    if used["bf16_shadow"]:
        return SGDWithShadow(model, lr, fused=used["fused_sgd"])
    return momentum_sgd(model.parameters(), lr, fused=used["fused_sgd"])


def describe_used(speed: dict) -> str:
    """One line for the run's start: which speed-ups are on, and why a graph is not."""
    on = [name for name, value in speed["on"].items() if value]
    text = ", ".join(on) if on else "none (baseline)"
    if speed["cuda_graph_off_because"] and speed["cuda_graph_off_because"] != "turned off":
        text += f"; no CUDA graph: {speed['cuda_graph_off_because']}"
    gemm = speed.get("update_in_gemm_off_because")
    if speed["on"]["bf16_shadow"] and gemm and gemm != "turned off":
        text += f"; lin1's update apart from its GEMM: {gemm}"
    return text
