"""lin1's shadow SGD in the epilogue of its weight-gradient GEMM, one Triton kernel in the
optimizer's step (kernels/lin1/dw_update.py): the update's memory traffic runs under the
GEMM's tensor-core work, and the 2.1 GB bf16 weight gradient is never written. lin1's
backward leaves the GEMM's operands to the optimizer instead (kernels/lin1/
deferred_linear.py), which torch.compile cannot trace: the trunk alone is compiled.

Off by default: measured on the H100, the kernel took what the GEMM and the SGD take apart,
and the step a little more (results/step.md). It needs bf16_shadow's master weights and one
rank: a gradient reduced across ranks must exist before its update."""

from training.speedups.base import SpeedUp, rebind

# Why each several-GPU design leaves no GEMM that could update.
_SHARDED = {
    "ddp": "with --parallel ddp each rank's weight gradient is all-reduced before the "
           "update, so the GEMM that makes it cannot update",
    "zero": "with --parallel zero lin1's gradient is reduce-scattered before a shard is "
            "updated, so the GEMM that makes it cannot update",
    "tp": "with --parallel tp lin1 is a sharded DTensor layer, which the GEMM's update is "
          "not built for",
    "tp2d": "with --parallel tp2d lin1's gradient is all-reduced across the hosts before "
            "the update, so the GEMM that makes it cannot update",
}


def refusal(cfg, cuda: bool) -> str | None:
    from training.ranks import from_env
    if not (cuda and cfg.amp and cfg.bf16_shadow):
        return ("it updates --bf16-shadow's fp32 master weights and momentum, which need "
                "bf16 autocast on a CUDA GPU (--amp)")
    if cfg.mode != "train":
        return "forward mode runs no update"
    if from_env().distributed:
        return _SHARDED[cfg.parallel]
    return None


def defer(model, build) -> None:
    from kernels.lin1.deferred_linear import PendingGrad, deferred_linear
    model.lin1.pending = PendingGrad()  # what bf16_shadow's optimizer takes

    def forward(lin1, x):
        return deferred_linear(x, lin1.weight, lin1.bias, lin1.pending)
    rebind(model.lin1, forward)
    model.compile_whole = False  # model/build.py: the trunk compiled, the head eager


SPEEDUP = SpeedUp(
    "update_in_gemm",
    "lin1's shadow SGD in the epilogue of its weight-gradient GEMM: auto (where it can: "
    "--bf16-shadow on one GPU, train mode), on, off",
    default="off", gpu_only=True, refusal=refusal, model=defer)
