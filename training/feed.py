"""How a step gets its batch onto the device: copied inside the step, on the compute stream
(InStep, the original's order), or batch k+1 copied on a side stream while the GPU runs
step k (CopyAhead).

Safe without a host-device sync: the compute stream waits for the side stream, each
device tensor is marked as used by the compute stream (record_stream), and the host
memory the copy reads is held until an event on the copying stream passes. The design in
full: docs/design.md, this module's section."""

import time

import torch

from core.phases import phase
from core.signals import stop_signals_held
from core.trees import leaves
from data.held_puts import held_iter


class InStep:
    """The batch fetched and copied at the step's start, on the compute stream.

    copy(host batch) -> device batch: the H2D copies alone; arrive(device batch) -> device
    batch: what must follow them on the compute stream (several ranks' box counts)."""

    def __init__(self, loader, copy, arrive):
        self.batches = held_iter(loader)  # PyTorch's loader forks its workers here
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
