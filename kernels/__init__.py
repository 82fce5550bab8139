"""The fused kernels, by purpose; each a torch custom op with autograd and a fake
implementation, so that torch.compile traces through it.

    giou/     the case study's loss: GIoU over the padded layout (the `kernel` and
              `conditional` strategies) and the packed one, in Triton and in CUDA C++
    trunk/    the conv trunk's blocks in Triton (the step's speed-ups in training/speedups/
              swap them into the model)
    lin1/     lin1's update: the bf16 weight's SGD with fp32 master weights, and that
              update inside the weight-gradient GEMM
    triton_op.py   how a Triton kernel becomes a custom op, on a GPU and in the interpreter
    rounding.py    rounding inside a kernel as the GPU rounds, in the interpreter too

Triton compiles for GPUs only; on a CPU-only machine its interpreter runs the same kernels
on CPU tensors. The variable must be set before triton is imported (triton reads it as its
modules load), so it is set when this package is first imported: every kernel module is
inside it, and importing losses imports it.
"""

import os
import sys

import torch

# Whether triton was imported before the variable could be set: then its kernels cannot
# run on this CPU-only machine (kernels.giou.check_backend says so in one line).
TRITON_BEFORE_INTERPRETER = False
if not torch.cuda.is_available():
    TRITON_BEFORE_INTERPRETER = ("triton" in sys.modules
                                 and os.environ.get("TRITON_INTERPRET") != "1")
    os.environ.setdefault("TRITON_INTERPRET", "1")
