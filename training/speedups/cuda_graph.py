"""The whole train step (forward, loss, backward, optimizer) captured once as a CUDA graph
and replayed: one launch a step instead of hundreds (training/cuda_graph.py says how).
Static-shape strategies in train mode on one GPU only.

Off by default: measured on the H100, the replay saved no GPU time (the step is GPU-bound)
and its step wall time was less steady (results/step.md)."""

from core.names import traits
from training.speedups.base import SpeedUp


def refusal(asked, cuda: bool) -> str | None:
    from training.ranks import from_env
    loss = asked.loss
    record = traits(loss)
    if record.layout == "list":
        return (f"the {loss} strategy's targets are ragged (their shapes change every "
                "batch), so its step cannot be captured as a CUDA graph")
    if record.layout == "packed":
        return (f"the {loss} strategy's targets are packed ([boxes, 4]: the number of "
                "boxes changes every batch), so its step cannot be captured as a CUDA graph")
    if record.syncs:
        return (f"the {loss} strategy's loss waits for the device (a host-device sync), "
                "which a CUDA graph cannot hold")
    if asked.mode != "train":
        return ("forward mode closes each phase with a device sync, which a CUDA graph "
                "cannot hold")
    if not cuda:
        return "CUDA graphs need a CUDA GPU"
    if asked["lin1_update_beside_trunk"] == "on":
        return ("lin1's update beside the trunk (--lin1-update-beside-trunk on) runs on into "
                "the next step's forward, which a graph of one step cannot hold")
    if from_env().distributed:
        return ("a step with DDP's all-reduces is not captured as a CUDA graph here (one "
                "GPU only)")
    if asked.wait < 2:
        return ("a CUDA graph needs --wait 2 or more: one eager step to compile and tune, "
                "one to capture, before the profiler records")
    return None


def graphed(train_step, to_device, asked):
    """Eager steps during the profiler's wait, the capture at its last wait step."""
    from training.cuda_graph import GraphedStep
    return GraphedStep(train_step, to_device, capture_at=asked.wait - 1)


SPEEDUP = SpeedUp(
    "cuda_graph",
    "replay the whole train step as one CUDA graph: auto (where it can: a static-shape "
    "strategy in train mode on a GPU), on, off",
    default="off", gpu_only=True, refusal=refusal, step=graphed)
