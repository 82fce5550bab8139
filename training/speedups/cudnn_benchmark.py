"""cuDNN times its convolution algorithms on the first call of each shape and keeps the
fastest, where its heuristics pick slow kernels for the small-channel convolutions. A
process-wide flag, and cuDNN keeps a process's first choice whatever the flag says later,
so a process that runs several runs keeps one value and refuses a run asking for the other.
The design in full: docs/design.md, this module's section."""

from core.errors import UserError
from training.speedups.base import SpeedUp

# The value of the first CUDA run of a process that measures several runs.
_first_choice: list[bool] = []


def set_flag(on: bool, cuda: bool, many_runs: bool) -> None:
    import torch
    if cuda and many_runs:
        if _first_choice and _first_choice[0] != on:
            raise UserError(
                f"this process already ran with cudnn_benchmark={_first_choice[0]}, and cuDNN "
                "keeps the algorithms it chose then: a run with "
                f"cudnn_benchmark={on} must start in a new process")
        _first_choice[:] = [on]
    torch.backends.cudnn.benchmark = on


SPEEDUP = SpeedUp(
    "cudnn_benchmark",
    "cuDNN autotunes each convolution in the first (unprofiled) step (GPU only)",
    gpu_only=True, process=set_flag)
