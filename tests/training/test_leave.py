"""A rank that ends early leaves its gloo group at exit within training/ranks.LEAVE_S,
with its own exit code, even where a collective it queued can never finish: the case a
Ctrl-C makes when it meets one rank after queueing DDP's all-reduce and the other before
(or in another collective). Freeing the group waited for that collective: up to the
group's 5 min timeout, until torchrun killed the rank."""

import os
import subprocess
import sys
import time

from tests.helpers import REPO
from tests.training.test_distributed import _free_port

# Two ranks queue collectives that do not match (an all-reduce, a broadcast), as DDP's
# bucket and a rank interrupted elsewhere do, then end as an early end does: the group
# still joined, leaving with code 130 as train.py and the studies do (core.commands).
RANK = """
import os, sys, time, torch, torch.distributed as dist
from training.ranks import Ranks
rank = int(os.environ["RANK"])
Ranks(rank, 2).start(cuda=False)
t = torch.ones(4)
dist.all_reduce(t, async_op=True) if rank == 0 else dist.broadcast(t, 1, async_op=True)
time.sleep(0.5)
print("queued", flush=True)
from core.commands import leave
leave(130)
"""


def test_an_early_end_leaves_a_group_with_a_collective_that_never_finishes():
    port, env = _free_port(), {**os.environ, "MASTER_ADDR": "127.0.0.1", "WORLD_SIZE": "2"}
    start = time.monotonic()
    ranks = [subprocess.Popen([sys.executable, "-c", RANK], cwd=REPO, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              env={**env, "MASTER_PORT": str(port), "RANK": str(rank)})
             for rank in (0, 1)]
    try:
        ends = [rank.communicate(timeout=60) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    took = time.monotonic() - start
    for rank, (out, err) in zip(ranks, ends):
        assert rank.returncode == 130 and out == "queued\n", (rank.returncode, out, err)
        assert "terminate called" not in err, err
    print(f"both ranks ended {took:.1f} s after they started")
    assert took < 20, "a rank waited for a collective that could never finish"


def test_a_main_thread_stuck_past_a_signal_gets_its_nccl_group_aborted(monkeypatch):
    """_unstick_after aborts the NCCL group when the main thread has not begun its early
    end within its seconds (it sat in a CUDA event's query on two H200s, its handler never
    run); not when it has."""
    import threading

    from training import ranks
    aborted = []
    monkeypatch.setattr(ranks, "abandon_nccl", lambda: aborted.append(time.monotonic()))
    monkeypatch.setattr(ranks, "_LAUNCHER", {})
    started = time.monotonic()
    ranks._unstick_after(0.3)
    assert len(aborted) == 1 and 0.3 <= aborted[0] - started < 1.0
    threading.Timer(0.1, ranks.stop_watching).start()  # the early end begins in time
    ranks._unstick_after(2.0)
    assert len(aborted) == 1


# A rank whose handlers cannot end it (they only count), its stuck-watch on: a SIGCHLD and
# a forked child's own SIGTERM must not wake the watch; this process's SIGTERM must.
STUCK = """
import os, signal, sys, time
from training import ranks
ranks.STUCK_S = 0.2
ranks.abandon_nccl = lambda: print("aborted", flush=True)
signal.signal(signal.SIGTERM, lambda *_: None)  # a handler that never gets to run, in effect
signal.signal(signal.SIGCHLD, lambda *_: None)
ranks._unstick_on_ending_signals()
child = os.fork()
if child == 0:
    os.kill(os.getpid(), signal.SIGTERM)
    os._exit(0)
os.waitpid(child, 0)
time.sleep(1.0)
print("ready", flush=True)
time.sleep(30)
"""


def test_a_stop_signal_to_a_stuck_nccl_rank_aborts_its_group_from_a_thread():
    """_unstick_on_ending_signals hears a stop signal through Python's wakeup fd, which the
    C-level handler writes whatever the main thread is doing, and aborts the group
    STUCK_S later; a data worker's own signal (a forked child) or a SIGCHLD does not."""
    rank = subprocess.Popen([sys.executable, "-c", STUCK], cwd=REPO, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        assert rank.stdout.readline() == "ready\n", rank.stderr.read()
        sent = time.monotonic()
        rank.send_signal(__import__("signal").SIGTERM)
        assert rank.stdout.readline() == "aborted\n", rank.stderr.read()
        assert time.monotonic() - sent < 5
    finally:
        rank.kill()
        rank.communicate()


def test_an_nccl_group_is_aborted_once_whichever_thread_comes_first(monkeypatch):
    """The early end and the stuck-watch may both abort: one abort a group, and a new
    group (another object, whatever its id) is aborted again."""
    import types

    from training import ranks
    aborted, group = [], [object()]
    c10d = types.SimpleNamespace(_abort_process_group=lambda: aborted.append(group[0]),
                                 _get_default_group=lambda: group[0])
    dist = types.SimpleNamespace(is_available=lambda: True, is_initialized=lambda: True,
                                 get_backend=lambda: "nccl", distributed_c10d=c10d)
    monkeypatch.setitem(sys.modules, "torch.distributed", dist)
    monkeypatch.setattr(ranks, "_ABANDONED", [])
    ranks.abandon_nccl()
    ranks.abandon_nccl()
    assert aborted == [group[0]]
    group[0] = object()
    ranks.abandon_nccl()
    assert len(aborted) == 2 and aborted[1] is group[0]


def test_an_early_end_releases_the_copy_engines_waits_where_they_ran(monkeypatch):
    """tp's copies by copy engine wait on flags that no NCCL abort ends: abandon_nccl sets
    them (peer_copies.release_waits) where that module was loaded, and only there."""
    import types

    from training import ranks
    released = []
    monkeypatch.delitem(sys.modules, "torch.distributed", raising=False)
    monkeypatch.delitem(sys.modules, "training.peer_copies", raising=False)
    ranks.abandon_nccl()
    monkeypatch.setitem(sys.modules, "training.peer_copies",
                        types.SimpleNamespace(release_waits=lambda: released.append(1)))
    ranks.abandon_nccl()
    assert released == [1]
