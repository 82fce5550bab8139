"""The training step's speed-ups (speedups.py, bf16_shadow.py), its CUDA graph
(cuda_graph.py), and several ranks under torchrun (ranks.py, ddp.py, distributed.py,
launch.py)."""
