"""The bench tools that time GPU work end on one line where no CUDA GPU is present (exit
1), not on a traceback from their first CUDA call; their --help works anywhere."""

import sys


def require_cuda(what: str) -> None:
    """Exits with 'needs a CUDA GPU: <what>' where torch sees no CUDA GPU."""
    import torch
    if not torch.cuda.is_available():
        sys.exit(f"needs a CUDA GPU: {what}")
