"""padded's loss and its gradient replayed as one CUDA graph (training/cuda_graph.py,
GraphedLoss): one launch where the eager loss launches ~110 tiny kernels a step, each
waiting behind the one before it. Fixed shapes are what padding buys; the maths is the
eager loss's kernel for kernel, captured at the first step. The design in full:
docs/design.md, this module's section."""

from core.names import PACKED, RAGGED
from training.speedups.base import SpeedUp


def refusal(asked, cuda: bool) -> str | None:
    loss = asked.loss
    if loss in RAGGED or loss in PACKED:
        return (f"the {loss} strategy's targets change shape every batch, so its loss "
                "cannot be captured as a CUDA graph")
    if loss != "padded":
        return (f"only padded's loss is many small PyTorch kernels on fixed shapes; the "
                f"{loss} strategy's is a few fused ones already")
    if asked.mode != "train":
        return "the graph holds the loss's backward too, which forward mode does not run"
    if not cuda:
        return "CUDA graphs need a CUDA GPU"
    if asked.wait < 1:
        return ("the graph is captured at the first step (a device sync), which needs "
                "--wait 1 or more to stay out of the profiled steps")
    return None


def graphed(loss_fn):
    from training.cuda_graph import GraphedLoss
    return GraphedLoss(loss_fn)


SPEEDUP = SpeedUp(
    "graphed_loss",
    "replay padded's loss and its gradient as one CUDA graph: auto (padded in train mode "
    "on a GPU), on, off",
    default="auto", gpu_only=True, refusal=refusal, loss=graphed,
    idle=lambda asked, on: "the whole step is one CUDA graph (--cuda-graph)"
    if on["cuda_graph"] else None)
