"""The training step's speed-ups (speedups.py) and its CUDA graph (cuda_graph.py)."""
