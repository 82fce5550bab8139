"""The convolutions' weights (and so their activations) in NHWC, the layout cuDNN's bf16
tensor-core kernels use: in NCHW cuDNN transposes or picks slower kernels, and Inductor's
pool and ReLU kernels read across channels. The Triton blocks after it write their outputs
in the layout of the next conv's weight."""

from training.speedups.base import SpeedUp


def to_nhwc(model, build) -> None:
    import torch
    model.to(memory_format=torch.channels_last)  # 4-D tensors only: the convolutions'


SPEEDUP = SpeedUp("channels_last", "NHWC convolutions (cuDNN's tensor-core layout)",
                  model=to_nhwc)
