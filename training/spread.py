"""What the several-rank code (ddp.py, parallel.py, distributed.py) reads of a run, as a
frozen record of its own. train.py fills it (spread_of); nothing here reads train.Config's
fields, so a field renamed there breaks train.py alone."""

from dataclasses import dataclass


@dataclass(frozen=True)
class Spread:
    parallel: str  # --parallel: auto as given, or the design chosen (parallel.choose)
    mode: str
    loss: str
    hidden: int  # lin1's rows, which the sharded designs split
    batch_size: int  # a rank's
    dataset_length: int
    bucket_mb: float  # the DDP knobs (ddp.HELP)
    bucket_view: bool
    comm_hook: str
    overlap: bool
