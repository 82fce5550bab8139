"""What the harness reads of a run's settings, as a frozen record of its own. train.py
fills it from its Config (plan_of): profiling/ lies below train.py and reads none of the
Config's fields, so a field renamed there breaks train.py alone."""

from dataclasses import dataclass


@dataclass(frozen=True)
class RunPlan:
    config: dict  # the run's whole configuration, as summary.json and the job's notes keep it
    loss: str
    mode: str
    batch_size: int
    image_size: int
    max_boxes: int
    hidden: int
    wait: int  # the profiler's schedule: skipped, traced and discarded, profiled steps
    warmup: int
    active: int
    steps: int
    seconds: float
    settle: int
    run_ahead: int
    hang_timeout: float
    memory_snapshot: bool
    parallel: str
    scaling_baseline: str
    runs_triton: bool  # a speed-up runs Triton kernels in the model
    ddp: dict  # the several-rank knobs, as summary.json records them
