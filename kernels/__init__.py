"""The fused kernels (giou/, trunk/, lin1/), each a torch custom op with autograd and a fake
implementation. Importing this package sets TRITON_INTERPRET on a machine without a GPU,
before triton is imported, so that the same kernels run on CPU tensors.
Its design in full: docs/kernels.md."""

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
