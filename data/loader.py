"""The DataLoader of a run: workers at low priority (at normal priority they preempted the
training process inside its timed ranges), optionally on their own cores. The design in
full: docs/design.md, this module's section."""

import atexit
import multiprocessing
import multiprocessing.util
import os
import signal
import sys
import traceback

import torch

from core.errors import UserError
from core.signals import unblock_stop_signals
from data import shared_memory
from data.ring_loader import RingLoader, ring_bytes

TORCH_PREFETCH = 2  # PyTorch's DataLoader's default prefetch_factor
BATCH_TIMEOUT_S = 300  # PyTorch's loader: a batch not back by then was lost in its worker

# Core affinity is a Linux call; elsewhere every process keeps the cores it has.
_CAN_PIN = hasattr(os, "sched_getaffinity")
_start_cores: frozenset[int] | None = None


def start_cores() -> frozenset[int]:
    """The cores this process started with (read once, before any run narrows them): a
    run with main_cores narrows the main thread's, and the next run of the same process
    (make compare) splits, or gets back, these."""
    global _start_cores
    if _start_cores is None:
        _start_cores = frozenset(os.sched_getaffinity(0)) if _CAN_PIN else frozenset()
    return _start_cores


def split_cores(main_cores: int, share: tuple[int, int] = (0, 1)
                ) -> tuple[set[int], set[int]] | None:
    """(cores of the training process, cores of the data workers), or None for no split.
    share = (i, n): this process is the i-th of n ranks on the host and keeps to the i-th
    of n shares of the cores (share_of), its workers too; main_cores then splits that."""
    index, count = share
    if main_cores <= 0 and count <= 1:
        return None
    if not _CAN_PIN:
        raise UserError("--main-cores and --rank-cores need Linux (os.sched_setaffinity)")
    cores = share_of(sorted(start_cores()), index, count)
    if main_cores <= 0:
        return set(cores), set(cores)
    if main_cores >= len(cores):
        raise UserError(f"--main-cores {main_cores} leaves no core for the data workers: "
                        f"this {'rank' if count > 1 else 'process'} may use {len(cores)}")
    return set(cores[:main_cores]), set(cores[main_cores:])


def share_of(cores: list[int], index: int, count: int, siblings=None) -> list[int]:
    """The index-th of count contiguous shares of `cores`, each physical core's hardware
    threads kept in one share and next to each other (so that main_cores=2 is one whole
    core). Why: under GPUS=4 each rank's main thread shared the cores with every rank's
    data workers, and its host time a step was nearly twice one GPU's
    (results/archive/several-gpus.md)."""
    groups: dict[tuple[int, ...], list[int]] = {}
    for core in cores:
        key = tuple(sorted(set((siblings or _siblings)(core)) & set(cores))) or (core,)
        groups.setdefault(key, []).append(core)
    whole = sorted(groups.values())
    if count > len(whole):
        raise UserError(f"{count} ranks on this host and {len(whole)} physical cores: "
                        "--rank-cores needs one a rank at least")
    return [c for group in whole[index * len(whole) // count:
                                 (index + 1) * len(whole) // count] for c in group]


def _siblings(core: int) -> list[int]:
    """The hardware threads of core's physical core (Linux's sysfs; [core] elsewhere)."""
    try:
        with open(f"/sys/devices/system/cpu/cpu{core}/topology/thread_siblings_list") as f:
            text = f.read().strip()
    except OSError:
        return [core]
    found = []
    for part in text.split(","):
        low, _, high = part.partition("-")
        found.extend(range(int(low), int(high or low) + 1))
    return found


# Set in the main process as it exits: from then on a worker ends on SIGTERM (the
# terminate() that multiprocessing sends its daemonic children at exit); before, a SIGTERM
# came from outside, to the whole group, and the main process acts on it alone.
_EXITING = multiprocessing.Event()
atexit.register(_EXITING.set)  # runs before multiprocessing's own exit handler (LIFO)


def _on_sigterm(signum, frame) -> None:
    if _EXITING.is_set():
        os._exit(0)


def _die_with(parent: int) -> None:
    """The worker is SIGKILLed as soon as its parent process dies (Linux's
    PR_SET_PDEATHSIG), rather than noticing up to 5 s later (the DataLoader's watchdog).
    Why it matters: a forked worker holds its parent's sockets, so a rank killed under
    GPUS=N kept its gloo connections open through its orphaned workers, and the other rank
    waited ~5 s in its collective, deaf to torchrun's SIGTERM. The workers are forked by
    the thread that iterates the loader, the main thread, which lives as long as the
    process."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    pr_set_pdeathsig = 1
    ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, int(signal.SIGKILL))
    if os.getppid() != parent:  # it died before the line above
        os._exit(0)


def _quiet_hang_ups(kind, value, tb, report=None) -> None:
    """A worker's sys.excepthook. PyTorch's loader passes each batch's tensors as file
    descriptors, which the main process fetches from a thread in the worker
    (multiprocessing.resource_sharer._serve). A main process ending on Ctrl-C or SIGTERM
    can hang up in the middle of a fetch, and that thread printed its traceback into the
    run's one-line stderr (1 in ~30 group SIGTERMs under CI's load). A hang-up there is
    dropped; anything else is reported as before."""
    frames = traceback.extract_tb(tb)
    if issubclass(kind, (EOFError, OSError)) and any(
            f.filename.endswith("resource_sharer.py") for f in frames):
        return
    (report or sys.__excepthook__)(kind, value, tb)


def _worker_init(worker_cores: set[int] | None):
    parent = os.getpid()

    def init(worker_id: int) -> None:
        _die_with(parent)
        sys.excepthook = _quiet_hang_ups
        # Ctrl-C and SIGTERM sent to the whole process group (a terminal, `timeout`, a
        # batch scheduler) reach the workers too: killed by one, a worker would make the
        # main process raise "worker killed by signal" in the middle of keeping the steps
        # it is ending with. The main process alone acts on them: it stops its workers
        # (None on their queues), or as it exits terminates them (_EXITING); a worker
        # whose parent is gone exits on its own.
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        signal.signal(signal.SIGTERM, _on_sigterm)
        unblock_stop_signals()  # forked with them blocked (feed.py, ring_loader.py)
        os.nice(19)
        if worker_cores:
            os.sched_setaffinity(0, worker_cores)
    return init


def _one_temp_folder_for_the_workers() -> None:
    """Makes this process's multiprocessing folder (pymp-*) before PyTorch's loader's
    workers fork, so that they share it. Each made its own for the socket of its batches'
    file descriptors (multiprocessing.resource_sharer), removed only by its exit's
    finalizers: one ended by _on_sigterm's os._exit or _die_with's SIGKILL left it behind.
    The ring loader's workers pass no file descriptors and make none."""
    multiprocessing.util.get_temp_dir()


def make_loader(dataset, batch_size: int, num_workers: int, collate, pin_memory: bool,
                main_cores: int = 0, sampler=None, ring: bool = False,
                share: tuple[int, int] = (0, 1)):
    """Batches in order (same seed, same batches for every strategy), last partial batch
    dropped; the collate is the strategy's. sampler: a rank's share of every global batch
    (training/distributed.RankShare), in order too. ring: the same batches from
    data/ring_loader.py, the images written by the workers into pinned shared buffers.
    share: (this rank, the host's ranks) where each rank keeps to its share of the cores
    (split_cores)."""
    cores = split_cores(main_cores, share)
    if _CAN_PIN:
        # Set before the loader starts: its threads inherit the main thread's cores, and
        # each forked worker then moves itself to the workers' cores.
        os.sched_setaffinity(0, cores[0] if cores else start_cores())
    if num_workers:  # shared memory: one line now, before the run, where it will not fit
        size = getattr(dataset, "image_size", 256)
        image = size * size  # uint8
        if ring:
            shared_memory.check(ring_bytes(batch_size, image, num_workers),
                                f"the ring loader ({num_workers} workers, batch {batch_size})")
        else:
            boxes = 4 * getattr(dataset, "max_boxes", 256)  # at most, as uint8 or a count
            shared_memory.check(num_workers * TORCH_PREFETCH * batch_size * (image + boxes),
                                f"PyTorch's loader ({num_workers} workers x {TORCH_PREFETCH} "
                                f"batches of {batch_size} in flight)")
    if ring:
        return RingLoader(dataset, batch_size, num_workers, collate, pinned=pin_memory,
                          sampler=sampler, worker_init_fn=_worker_init(cores[1] if cores
                                                                       else None))
    if num_workers:
        _one_temp_folder_for_the_workers()
    return torch.utils.data.DataLoader(
        dataset, batch_size=batch_size, shuffle=False, sampler=sampler, drop_last=True,
        num_workers=num_workers, collate_fn=collate, pin_memory=pin_memory,
        worker_init_fn=_worker_init(cores[1] if cores else None),
        # A batch lost in a worker (its pickling thread failing on a full /dev/shm) made
        # the main process wait for it forever; a batch takes well under a second.
        timeout=BATCH_TIMEOUT_S if num_workers else 0)


def own_rate(loader) -> dict | None:
    """The loader's own rate as measured during the run (RingLoader.rate: its workers'
    batches per second); None for PyTorch's loader, which gives no such figure
    (bench/loader_rate.py measures it alone)."""
    return loader.rate() if isinstance(loader, RingLoader) else None
