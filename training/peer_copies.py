"""tp's features all-gather and dx's reduce-scatter moved by the copy engines, with no kernel:
each rank's rows sit in symmetric memory, the peers pull them with plain device copies,
ordered by flags the GPU's front end writes and waits on (cuStreamWriteValue32 /
cuStreamWaitValue32). cuBLAS's persistent GEMMs hold every SM; the copy engines need none.
It has no watchdog: release_waits is its abort, for a rank's early end. The design in
full: docs/design.md, this module's section."""

import ctypes
import functools
import threading
import time
import warnings

import torch
import torch.distributed as dist

# A rank's flags, each an int32 a peer: READY (a peer's rows are there to pull), DONE (a
# peer has pulled this rank's rows), the same two for the reduce-scatter.
READY, DONE, READY2, DONE2 = range(4)
_EQUAL = 1  # CU_STREAM_WAIT_VALUE_EQ
_SETS: dict = {}
_RELEASING: list = []  # the release's thread, once begun
RELEASE_S = 0.001  # between two rounds of the release's writes


@functools.cache
def _memops():
    """(wait, write) of libcuda: a stream waits until an int32 in device memory equals a
    value; a stream writes one (after its earlier work, with a memory fence)."""
    lib = ctypes.CDLL("libcuda.so.1")
    found = []
    for name in ("cuStreamWaitValue32_v2", "cuStreamWriteValue32_v2"):
        fn = getattr(lib, name)
        fn.argtypes = [ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint32, ctypes.c_uint]
        fn.restype = ctypes.c_int
        found.append(fn)
    return tuple(found)


def _call(fn, stream, address: int, value: int, flags: int) -> None:
    code = fn(stream.cuda_stream, address, value, flags)
    if code:
        raise RuntimeError(f"{fn.__name__} failed with CUDA driver error {code}")


class _PeerSet:
    """One group's buffers for one shape: G (every rank's rows, gathered), D (every rank's
    rows of dx, to be reduce-scattered), a receive buffer a peer, the flags; made at the
    first call (outside any CUDA graph's capture: the graphed head warms up eagerly)."""

    def __init__(self, group, batch: int, columns: int, dtype, device):
        from torch.distributed import _symmetric_memory as symm
        name = group.group_name
        with warnings.catch_warnings():  # needed on torch 2.11, deprecated on 2.13
            warnings.simplefilter("ignore", FutureWarning)
            if hasattr(symm, "enable_symm_mem_for_group"):
                symm.enable_symm_mem_for_group(name)
        self.n, self.rank = dist.get_world_size(group), dist.get_rank(group)
        self.batch, self.peers = batch, [q for q in range(self.n) if q != self.rank]
        rows, size = self.n * batch, batch * columns
        self.gathered = symm.empty(rows, columns, dtype=dtype, device=device)
        self.partial = symm.empty(rows, columns, dtype=dtype, device=device)
        flags = symm.empty(4 * self.n, dtype=torch.int32, device=device)
        flags.zero_()
        flags.view(4, self.n)[[DONE, DONE2]] = 1  # nothing of this rank is being pulled
        torch.cuda.synchronize(device)  # host-device sync: once a buffer set, before peers map it
        gathered = symm.rendezvous(self.gathered, name)
        partial = symm.rendezvous(self.partial, name)
        shared = symm.rendezvous(flags, name)
        self.their_rows = {q: gathered.get_buffer(q, (batch, columns), dtype, q * size)
                           for q in self.peers}
        self.rows_here = {q: self.gathered[self.rows(q)] for q in self.peers}
        self.my_partials = {q: partial.get_buffer(q, (batch, columns), dtype,
                                                  self.rank * size) for q in self.peers}
        self.received = {q: torch.empty(batch, columns, dtype=dtype, device=device)
                         for q in self.peers}
        # Every rank's flags as this process maps them (get_buffer, as for the rows).
        self.flag_views = [shared.get_buffer(q, (4 * self.n,), torch.int32)
                           for q in range(self.n)]
        self.theirs = [view.data_ptr() for view in self.flag_views]
        self.mine = self.theirs[self.rank]
        # Held for the run: freed, the flags' memory and the peers' mappings would go.
        self.flags, self.handles = flags, (gathered, partial, shared)
        self.side = torch.cuda.Stream(device)
        dist.barrier(group, device_ids=[device.index])  # named: torch warns on every rank

    def rows(self, q: int) -> slice:
        return slice(q * self.batch, (q + 1) * self.batch)

    def flag(self, base: int, kind: int, q: int) -> int:
        return base + 4 * (kind * self.n + q)

    def wait_and_clear(self, stream, kind: int, q: int) -> None:
        wait, write = _memops()
        _call(wait, stream, self.flag(self.mine, kind, q), 1, _EQUAL)
        _call(write, stream, self.flag(self.mine, kind, q), 0, 0)

    def tell(self, stream, kind: int, q: int) -> None:
        """Sets this rank's flag `kind` on peer q."""
        _call(_memops()[1], stream, self.flag(self.theirs[q], kind, self.rank), 1, 0)

    def pull(self, ready: int, done: int, sources: dict, targets: dict) -> None:
        """On the side stream: tell every peer this rank's rows are ready, then for each
        peer wait for its rows, copy them (copy engine) and tell it they were pulled."""
        with torch.cuda.stream(self.side):
            for q in self.peers:
                self.tell(self.side, ready, q)
            for q in self.peers:
                self.wait_and_clear(self.side, ready, q)
                targets[q].copy_(sources[q])
                self.tell(self.side, done, q)


def _set_for(group, batch: int, columns: int, like: torch.Tensor) -> _PeerSet:
    """The group's buffer set for a batch of rows of `columns` in like's dtype, made at
    its first call (the forward's gather, on every rank at once)."""
    key = (group.group_name, batch, columns, like.dtype)
    if key not in _SETS:
        _SETS[key] = _PeerSet(group, batch, columns, like.dtype, like.device)
    return _SETS[key]


def gather(x, group):
    """(full, wait) as tensor_parallel.nccl_gather: full is this group's G."""
    peers = _set_for(group, x.shape[0], x.shape[1], x)
    main = torch.cuda.current_stream()
    for q in peers.peers:  # every peer pulled this rank's rows of the call before
        peers.wait_and_clear(main, DONE, q)
    peers.gathered[peers.rows(peers.rank)].copy_(x)
    peers.side.wait_stream(main)
    peers.pull(READY, DONE, peers.their_rows, peers.rows_here)
    return peers.gathered, lambda: torch.cuda.current_stream().wait_stream(peers.side)


def scatter_buffer(rows: int, columns: int, like: torch.Tensor, group) -> torch.Tensor:
    """This group's D, once every peer has pulled its rows of the call before."""
    peers = _set_for(group, rows // dist.get_world_size(group), columns, like)
    main = torch.cuda.current_stream()
    for q in peers.peers:
        peers.wait_and_clear(main, DONE2, q)
    return peers.partial


def scatter(dx_full, group, batch: int):
    """finish as tensor_parallel.nccl_scatter: each peer's partial sums of this rank's
    rows pulled beside the caller's next GEMM, added to this rank's own on finish()."""
    peers = _set_for(group, batch, dx_full.shape[1], dx_full)
    peers.side.wait_stream(torch.cuda.current_stream())
    peers.pull(READY2, DONE2, peers.my_partials, peers.received)

    def finish():
        torch.cuda.current_stream().wait_stream(peers.side)
        dx = dx_full[peers.rows(peers.rank)]
        for q in peers.peers:  # two ranks: one addition, NCCL's sum bit for bit; a tp
            dx = dx + peers.received[q]  # group has two ranks or more, so dx is new
        return dx
    return finish


def release_waits() -> None:
    """An early end (training/ranks.abandon_nccl): every flag this rank's streams may wait
    on is set to 1, again after each round, on a daemon thread until the process exits.
    Each wait then passes within a round and the clear behind it is undone by the next, so
    the streams drain: their copies read a dead peer's rows (its memory lives on while this
    rank maps it) and nothing after an early end reads what they wrote. The writes go on a
    stream of their own, which waits behind none of the stuck ones; the main thread's call
    that waits for the device meanwhile holds no GIL (torch's cudart bindings release it)."""
    if not _SETS or _RELEASING:
        return
    sets = list(_SETS.values())
    addresses = [peers.flag(peers.mine, kind, q) for peers in sets
                 for kind in (READY, DONE, READY2, DONE2) for q in range(peers.n)]
    device = sets[0].flags.device
    thread = threading.Thread(target=_keep_setting, args=(addresses, device), daemon=True,
                              name="release-copies")
    _RELEASING.append(thread)
    thread.start()


def _keep_setting(addresses: list[int], device) -> None:
    try:
        torch.cuda.set_device(device)  # the driver's calls in this thread: the run's context
        stream = torch.cuda.Stream(device)  # non-blocking: not ordered after the stuck ones
        write = _memops()[1]
        while True:
            for address in addresses:
                _call(write, stream, address, 1, 0)
            while not stream.query():  # polled: no blocking call, no sync beside the others
                time.sleep(RELEASE_S)
            time.sleep(RELEASE_S)
    except Exception:  # noqa: BLE001 (a context already broken waits on nothing; the early
        return  # end's one line stays the only one on stderr)
