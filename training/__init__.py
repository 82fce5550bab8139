"""The training step around the model: its optimizer (optimizer.py), its speed-ups
(speedups/, one module each), the CUDA graph's replay (cuda_graph.py), the batch copied a
step ahead (feed.py), and several ranks under torchrun (ranks.py, launch.py, ddp.py,
distributed.py, parallel.py)."""

import sys

# Run as `python3 -m training.launch` (sys.argv[0] is "-m" while the module is
# found): a Ctrl-C or SIGTERM during the imports (torch's take seconds) is noted, and the
# command ends on it at its start (130, one line; core/commands.run_command), not by the
# signal or a traceback.
if sys.argv[:1] == ["-m"]:
    import core.commands  # noqa: F401  its exit callback registered first, so run last
    from core.signals import note_stop_signals
    note_stop_signals()
