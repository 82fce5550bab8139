"""A loader whose workers write each batch's images straight into a ring of shared host
buffers that the main process registers as pinned once they have forked (the design FFCV
uses, with processes for its threads).

Why: PyTorch's loader copies each 64 MB image batch three times on the host before its
H2D copy, the last in the main process's pin thread alone; here it is written once, into
memory CUDA has registered as pinned, and each H2D copy is one DMA. A slot is written
again only once the device copy read from it has completed. The design in full:
docs/design.md, this module's section."""

import time

import torch
from torch.utils.data import BatchSampler, Dataset, SequentialSampler

from core.errors import UserError
from core.trees import map_leaves
from core.waits import wait_for
from data import shared_memory
from data.held_puts import held_iter
from data.ring_targets import nbytes, pack, unpack

_PIXEL = torch.zeros(1, 1, 1, dtype=torch.uint8)  # the collate's stand-in for an image
PREFETCH = 2  # batches each worker keeps ready (the DataLoader's prefetch_factor)
SPARE_SLOTS = 2  # the batch in use and the one whose copy may still be in flight
TARGET_FLOOR = 64 * 1024  # bytes of targets a slot holds at least


def ring_bytes(batch_size: int, sample_bytes: int, workers: int) -> int:
    """What the ring will ask of shared memory, before its first batch says exactly: the
    images, and TARGET_FLOOR of targets, a slot (the workload's padded targets: 1 MB a
    batch at 1024)."""
    slots = PREFETCH * max(workers, 1) + SPARE_SLOTS
    return slots * (batch_size * sample_bytes + TARGET_FLOOR)


class _NumberedBatches(BatchSampler):
    """The batch sampler's index lists, each with its batch number: the number says
    which ring slot the batch's images go to."""

    def __iter__(self):
        yield from enumerate(super().__iter__())


class _RingDataset(Dataset):
    """The dataset, read a batch at a time into ring slots (DataLoader's __getitems__)."""

    def __init__(self, dataset, images: torch.Tensor, targets: torch.Tensor, collate):
        self.dataset, self.images, self.targets, self.collate = dataset, images, targets, collate

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitems__(self, numbered):
        started = time.perf_counter()
        number, indices = numbered
        slot = number % self.images.shape[0]
        out = self.images[slot].numpy()  # numpy's copy of 64 KB: several times a copy_'s speed
        pairs = []
        for row, index in enumerate(indices):
            image, boxes = self.dataset[index]
            out[row] = image.numpy()
            pairs.append((_PIXEL, boxes))
        # The strategy's own collate makes the targets (and refuses a sample with more
        # boxes than the model predicts); its stacked stand-in images are dropped. The
        # targets go into the slot; those too large for it cross pickled, as arrays (a
        # tensor would be moved into shared memory and its file descriptor passed by a
        # server thread of this worker, which could print a traceback as it is stopped).
        _, targets = self.collate(pairs)
        layout = pack(targets, self.targets[slot])
        if layout is None:
            layout = _Pickled(map_leaves(torch.Tensor.numpy, targets))
        return slot, layout, time.perf_counter() - started


class _Pickled:
    """Targets that did not fit their slot, as numpy arrays."""

    def __init__(self, arrays):
        self.arrays = arrays


def _keep(batch):
    return batch  # __getitems__ returned the whole batch already


def _tensors(arrays, pin: bool):
    """Pickled targets' arrays as tensors in the main process, pinned where the batch goes
    to a GPU."""
    def tensor(array):
        made = torch.from_numpy(array)
        return made.pin_memory() if pin else made
    return map_leaves(tensor, arrays)


class RingLoader:
    """Batches (images, targets) as make_loader gives them, the images in ring slots."""

    def __init__(self, dataset, batch_size: int, num_workers: int, collate, pinned: bool,
                 sampler=None, worker_init_fn=None):
        self.pinned, self.pin = False, pinned
        self.workers = num_workers
        self.made, self.seconds = 0, 0.0  # batches handed out, their seconds in a worker
        self.dataset, self.batch_size, self.collate = dataset, batch_size, collate
        self.in_flight = PREFETCH * max(num_workers, 1)
        self.batches = _NumberedBatches(sampler or SequentialSampler(dataset), batch_size,
                                        drop_last=True)
        self.worker_init_fn = worker_init_fn
        self.ring = self.images = self.targets = self.loader = None  # made by _make

    def _make(self) -> None:
        """The ring and the DataLoader over it, at the first iteration: the first batch
        is made here once, for the images' shape and the targets' size, so a dataset that
        fails then fails inside the run. One buffer holds every slot's images, then every
        slot's targets: one registration as pinned memory."""
        _, indices = next(iter(self.batches))
        samples = [self.dataset[i] for i in indices]
        sample_shape = tuple(samples[0][0].shape)
        _, first = self.collate(samples)
        # Room for twice the first batch's targets (the padded layout's are always the
        # same size; a list's vary a little around their mean), at least TARGET_FLOOR.
        target_bytes = max(2 * nbytes(first), TARGET_FLOOR)
        slots = self.in_flight + SPARE_SLOTS
        image_bytes = self.batch_size * torch.Size(sample_shape).numel()
        size = slots * (image_bytes + target_bytes)
        self.ring = torch.empty(size, dtype=torch.uint8)
        if self.workers:  # shared before the workers fork: every process writes its pages
            shared_memory.check(size, f"the ring loader's {slots} batch slots")
            try:
                self.ring.share_memory_()
            except RuntimeError as exc:  # /dev/shm filled since the check
                shared_memory.remove_own_leftovers()
                raise UserError(f"the ring loader's {slots} batch slots ({size / 1e6:.0f} "
                                f"MB) do not fit in shared memory ({exc}): see --num-workers "
                                "and --batch-size") from None
        self.images = self.ring[:slots * image_bytes].view(slots, self.batch_size,
                                                           *sample_shape)
        self.targets = self.ring[slots * image_bytes:].view(slots, target_bytes)
        self.loader = torch.utils.data.DataLoader(
            _RingDataset(self.dataset, self.images, self.targets, self.collate),
            batch_sampler=self.batches, num_workers=self.workers, collate_fn=_keep,
            prefetch_factor=PREFETCH if self.workers else None,
            worker_init_fn=self.worker_init_fn)

    def __len__(self) -> int:
        return len(self.batches)

    def __iter__(self):
        # The workers fork when the iteration starts; the pages are registered after: CUDA
        # may keep pinned pages out of a forked child (MADV_DONTFORK), and the workers must
        # see the ring.
        self.close()
        if self.loader is None:
            self._make()
        batches = held_iter(self.loader)
        self.pinned = self.pin and _register(self.ring)
        copies = []  # events after the device copies of the batches handed out, oldest first
        handed = False
        while True:
            if self.pinned and handed:
                # The batch handed out last has had its step: its copies are enqueued.
                event = torch.cuda.Event()
                event.record()
                copies.append(event)
                if len(copies) >= SPARE_SLOTS:
                    # The slot the loader fills next was last read by this batch's copy.
                    oldest = copies.pop(0)
                    if not oldest.query():  # done long ago, as a rule: no wait, no sync
                        wait_for(oldest)  # host waits for an H2D copy
            try:
                slot, layout, seconds = next(batches)
            except StopIteration:
                return
            handed = True
            self.made, self.seconds = self.made + 1, self.seconds + seconds
            # Handed out without a reference left here: targets that came pickled are
            # freed when the step drops them, as with PyTorch's loader (kept, they would
            # be freed inside the next step, under the profiler).
            held = [layout]
            del layout
            yield self.images[slot], self._targets(held.pop(), slot)

    def _targets(self, layout, slot: int):
        """A batch's targets: views of its slot, or the pickled ones as tensors (pinned
        where the batch goes to a GPU)."""
        if isinstance(layout, _Pickled):
            return _tensors(layout.arrays, self.pinned)
        return unpack(layout, self.targets[slot])

    def rate(self) -> dict | None:
        """The workers' own rate over the batches handed out: how many batches a second
        they make together, each worker's batch timed inside it (generation, the writes
        into the slot, the collate, the targets' writes) under the run's load. The main
        process's part (a message of a few numbers per batch) is not in it. None before a
        batch."""
        if not self.made:
            return None
        batch_ms = self.seconds / self.made * 1e3
        return {"workers": self.workers, "batches": self.made,
                "worker_batch_ms": round(batch_ms, 3),
                "batches_per_s": round(max(self.workers, 1) / batch_ms * 1e3, 2)}

    def close(self) -> None:
        """Unregisters the ring's pages, before they are freed."""
        if self.pinned:
            torch.cuda.cudart().cudaHostUnregister(self.ring.data_ptr())
            self.pinned = False

    def __del__(self):
        self.close()


def _register(ring: torch.Tensor) -> bool:
    """Registers the ring's pages with CUDA as pinned memory; False without a GPU."""
    if not torch.cuda.is_available():
        return False
    code = torch.cuda.cudart().cudaHostRegister(ring.data_ptr(), ring.numel(), 0)
    if int(code) != 0:
        raise RuntimeError(f"cudaHostRegister of the loader's ring failed (CUDA error "
                           f"{int(code)}); run with --loader torch")
    return True
