"""The training step around the model: its optimizer (optimizer.py), its speed-ups
(speedups/, one module each), the CUDA graph's replay (cuda_graph.py), the batch copied a
step ahead (feed.py), and several ranks under torchrun (ranks.py, launch.py, ddp.py,
distributed.py, parallel.py)."""

import sys

# Run as `python3 -m training.launch` (sys.argv[0] is "-m" while the module is found).
if sys.argv[:1] == ["-m"]:
    from core.commands import program_starts
    program_starts()
