"""Gzips the profiler's Chrome trace fast, after torch.profiler.tensorboard_trace_handler
wrote it as plain JSON: the handler's own gzip writes a line at a time, at level 9. The
design in full: docs/design.md, this module's section."""

import gzip
import os
import shutil
from pathlib import Path

COMPRESS_LEVEL = 6
CHUNK = 1 << 20


def gzip_traces(run_dir: Path, worker: str = "*") -> list[Path]:
    """Replaces each plain *.pt.trace.json in run_dir (or only worker's: each rank of a
    job packs its own) by its .gz; returns the .gz paths."""
    written = []
    for plain in sorted(Path(run_dir).glob(f"{worker}.*pt.trace.json")):
        packed = plain.with_name(plain.name + ".gz")
        partial = plain.with_name(plain.name + ".gz.partial")  # never a half-written .gz
        try:
            with open(plain, "rb") as fin, \
                    gzip.open(partial, "wb", compresslevel=COMPRESS_LEVEL) as fout:
                shutil.copyfileobj(fin, fout, CHUNK)
            os.replace(partial, packed)
        finally:
            partial.unlink(missing_ok=True)
        plain.unlink(missing_ok=True)  # rank 0 may drop it in its early end
        written.append(packed)
    return written


def remove_plain_traces(run_dir: Path, worker: str = "*") -> None:
    """Drops plain traces (a run that ended before its trace was gzipped)."""
    for plain in Path(run_dir).glob(f"{worker}.*pt.trace.json"):
        plain.unlink(missing_ok=True)
