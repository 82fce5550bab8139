"""How a step gets its batch onto the device: copied inside the step, or ahead of it.

    feed = CopyAhead(loader, copy, arrive) if ... else InStep(loader, copy, arrive)
    for step in ...:
        images, targets = feed.take()    # this step's batch, on the device
        ...                              # the step's work, enqueued
        feed.prepare()                   # CopyAhead: the next batch, copying already

InStep is the original's order: the batch is fetched from the loader and copied to the
device at the step's start, on the compute stream, so the step's GPU work begins with the
copy (the 64 MB image batch at the GPU preset: about 1.3 ms at the ~51 GB/s of a pinned
copy, results/step.md).

CopyAhead copies batch k+1 on a side stream while the GPU runs step k, on a copy engine
beside the SMs: the compute stream's step no longer holds the copy. What makes it safe,
without a host-device sync:
- the compute stream waits for the side stream before it reads the batch (wait_stream:
  a wait on the GPU, the host does not block);
- every device tensor of the batch is marked as used by the compute stream
  (record_stream), so the caching allocator does not give its memory to a later copy
  before the step that reads it has finished;
- the host memory the copy reads stays untouched until the copy is done: PyTorch's pinned
  blocks (its loader's, and the ring's targets) are held by the host allocator until an
  event on the copying stream passes; a slot of data/ring_loader.py is held by the ring's
  own event, which it records on the current stream when the next batch is asked for, so
  prepare() asks for it on the side stream, behind the previous batch's copies.

Each phase keeps its name: 'data' (waiting for the loader) and 'copy' (enqueueing the
copies) run in step k's range for batch k+1 under CopyAhead, and the time spent waiting
for the loader is kept per step (waited_ms) for the run's data-wait figures.
"""

import time

import torch

from core.phases import phase
from core.signals import stop_signals_held
from core.trees import leaves


class InStep:
    """The batch fetched and copied at the step's start, on the compute stream.

    copy(host batch) -> device batch: the H2D copies alone; arrive(device batch) -> device
    batch: what must follow them on the compute stream (several ranks' box counts)."""

    def __init__(self, loader, copy, arrive):
        with stop_signals_held(forks=True):  # PyTorch's loader forks its workers here
            self.batches = iter(loader)
        self.copy, self.arrive = copy, arrive
        self._waited = 0.0

    def host(self):
        """The next host batch from the loader (StopIteration at its end)."""
        t0 = time.perf_counter()
        with phase("data"):
            try:
                return next(self.batches)
            finally:
                self._waited += time.perf_counter() - t0

    def take(self):
        batch = self.host()
        with phase("copy"):
            return self.arrive(self.copy(batch))

    def prepare(self) -> None:
        """Nothing ahead of the step."""

    def close(self) -> None:
        """Stops the loader's workers now, in the run's own flow, with Ctrl-C and SIGTERM
        held (acted on once they are stopped), not in PyTorch's iterator's __del__, where a
        SIGTERM's KeyboardInterrupt is printed as "Exception ignored in: ..."."""
        batches, self.batches = self.batches, iter(())
        with stop_signals_held():
            close = getattr(batches, "close", None)  # the ring loader's generator
            if close is not None:
                close()
            stop = getattr(batches, "_shutdown_workers", None)  # PyTorch's iterator
            if stop is not None:
                stop()
            del batches

    def waited_ms(self) -> float:
        """Milliseconds spent waiting for the loader since the last call."""
        waited, self._waited = self._waited, 0.0
        return waited * 1e3


class CopyAhead(InStep):
    """Batch k+1 copied on a side stream during step k (CUDA only)."""

    def __init__(self, loader, copy, arrive):
        super().__init__(loader, copy, arrive)
        self.stream = torch.cuda.Stream()
        self.ready = None      # the next batch on the device, its copies enqueued
        self.ended = False     # the loader has no batch left

    def prepare(self) -> None:
        if self.ready is not None or self.ended:
            return
        with torch.cuda.stream(self.stream):
            try:
                batch = self.host()  # a ring records its slot's event here: on this stream
            except StopIteration:
                self.ended = True
                return
            with phase("copy"):
                self.ready = self.copy(batch)

    def take(self):
        self.prepare()  # the first step: nothing was copied ahead of it
        if self.ready is None:
            raise StopIteration
        batch, self.ready = self.ready, None
        compute = torch.cuda.current_stream()
        compute.wait_stream(self.stream)  # no host sync: the compute stream waits
        for tensor in leaves(batch):  # the images and every target tensor
            tensor.record_stream(compute)
        return self.arrive(batch)
