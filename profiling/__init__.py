"""Turning a run's profiler trace into per-phase numbers and tables (kept out of train.py)."""
