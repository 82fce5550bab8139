"""Where this process stands in a torchrun job (make profile GPUS=N, training/launch.py):
its rank, the world, its device, and the little the ranks tell each other outside the
training step (the run folder's name, each rank's summary at the end).

A process that torchrun did not start (no WORLD_SIZE, or 1) is a world of one: nothing
here touches torch.distributed then, and the run is exactly the single-process one.
"""

import atexit
import os
import re
import shutil
import signal
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta

from core import waits
from core.bounded import finished_within
from core.errors import (
    ERRORS_ENV,
    ProjectError,
    launcher_folder,
    leave_for_launcher,
    left_line,
    one_line,
)
from training import job_notes

# How often a rank looks for its launcher, and how long its early end may then take
# before it exits regardless (its main thread may be stuck in a collective).
WATCH_S, GRACE_S = 0.5, 30.0
# How long the main thread has to take a signal that ends the run before its NCCL group is
# aborted from a thread (_unstick_on_ending_signals says why).
STUCK_S = 2.0
LET_GO_S = 5.0  # how long rank 0 waits for the others to let go of a folder it renames
LEAVE_S = 2.0  # how long an early end waits, at exit, for its gloo group to be freed
_LAUNCHER: dict = {}  # the pid of the launcher this rank watches


class RankRefused(ProjectError):
    """Rank 0 refused before the ranks' work began (Ranks.share): every rank ends on its
    line, the same one, with its exit code."""

    def __init__(self, line: str, code: int):
        super().__init__(line)
        self.exit_code = code


class PeerGone(ProjectError):
    """Another rank ended while this one waited for it in a collective outside the step
    (joining the group, sharing the run folder, gathering the summaries)."""


class LauncherGone(RuntimeError):
    """The launcher that started this rank ended without stopping it (SIGKILL: the OOM
    killer, a scheduler's escalation, kill -9)."""


# A collective's wait until a run's first steps are done (compiling, cuDNN's tuning: a
# rank may be minutes behind its peers); then --hang-timeout (set_hang_timeout).
START_TIMEOUT = timedelta(minutes=5)
HANG_TIMEOUT_S = 120.0  # --hang-timeout's default
JOIN_FLOOR_S = 20.0  # the group's start waits this at least (Ranks.start)


@dataclass(frozen=True)
class Ranks:
    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def distributed(self) -> bool:
        return self.world > 1

    @property
    def main(self) -> bool:
        """Rank 0: the one that prints, names the run folder and writes the summary."""
        return self.rank == 0

    def device(self, cuda: bool):
        """This rank's device: GPU local_rank (made current, so that every "cuda" tensor
        lands there), or the CPU."""
        import torch
        if not cuda:
            return torch.device("cpu")
        torch.cuda.set_device(self.local_rank)
        return torch.device("cuda", self.local_rank)

    def start(self, cuda: bool, hang_timeout: float = HANG_TIMEOUT_S):
        """This rank's device, and the process group joined (NCCL between GPUs, gloo
        between CPU processes), once per process. Joining waits hang_timeout at most
        (JOIN_FLOOR_S at least): the ranks arrive seconds apart, but one stopped before it
        must be named. Its pid is left first, for the peer that names it."""
        import torch.distributed as dist
        device = self.device(cuda)
        if self.distributed and not dist.is_initialized():
            _bind_defaults_before_the_group()
            job_notes.leave_pid(self.rank)
            join = timedelta(seconds=max(hang_timeout, JOIN_FLOOR_S))
            with _peers_alive(self):
                dist.init_process_group("nccl" if cuda else "gloo", timeout=join)
            # The step's collectives finish in milliseconds; a rank that waits minutes is
            # waiting for a dead peer, which torchrun kills sooner anyway. Until the first
            # steps are done (compiling), they wait START_TIMEOUT, the store's too.
            set_hang_timeout(None)
            store = getattr(dist.distributed_c10d, "_get_default_store", None)
            if store is not None:
                store().set_timeout(START_TIMEOUT)
            _watch_the_launcher()
            if cuda:
                _unstick_on_ending_signals()
            atexit.register(_leave_after_an_early_end)
        return device

    def share(self, make):
        """make() on rank 0, its value on every rank (a collective). Where rank 0's make()
        refuses (a ProjectError), every rank raises its line, rather than meet rank 0's
        closed socket in the broadcast."""
        if not self.distributed:
            return make()
        import torch.distributed as dist
        box, refusal = [None], None
        if self.main:
            try:
                box = [("value", make())]
            except ProjectError as exc:
                refusal, box = exc, [("refused", (one_line(exc), exc.exit_code))]
        with _peers_alive(self):
            dist.broadcast_object_list(box, src=0)
        kind, value = box[0]
        if kind == "value":
            return value
        # Every rank ends on the refusal: leave the group together, while Python lives
        # (_bind_defaults_before_the_group says why).
        stop()
        if refusal is not None:
            raise refusal
        raise RankRefused(*value)

    def gather(self, value) -> list:
        """Every rank's value, in rank order, on every rank (a collective)."""
        if not self.distributed:
            return [value]
        import torch.distributed as dist
        out = [None] * self.world
        with _peers_alive(self):
            dist.all_gather_object(out, value)
        return out

    def let_go(self, name: str) -> None:
        """This rank, ending early, is done with the run folder `name`: rank 0 may rename
        it (wait_for_others)."""
        store = _store()
        if store is not None:
            try:
                store.set(f"let-go/{name}/{self.rank}", "1")
            except RuntimeError:  # the launcher, which holds the store, is gone
                pass

    def wait_for_others(self, name: str) -> None:
        """Rank 0, about to rename the run folder `name` after a Ctrl-C or SIGTERM: waits
        LET_GO_S at most until every other rank has let go of it, since a rank still
        exporting its trace into it made kineto's own rename fail."""
        store = _store()
        if store is None:
            return
        try:
            store.wait([f"let-go/{name}/{rank}" for rank in range(1, self.world)],
                       timedelta(seconds=LET_GO_S))
        except RuntimeError:  # a timeout (DistStoreError), or the store's host gone
            pass

    def worker_name(self) -> str:
        """The trace's worker name: TensorBoard's plugin tells the ranks apart by it."""
        return f"rank{self.rank}" if self.distributed else "train"

    def leave_error(self, line: str) -> bool:
        """Leaves this rank's one-line error for the launcher, which prints the line of
        the rank that failed first; False when no launcher asked for it."""
        return self.distributed and leave_for_launcher(line)


def _store():
    """The process group's store (under torchrun, its agent's: it outlives every rank), or
    None where no group exists or this torch cannot give it."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return None
    get = getattr(dist.distributed_c10d, "_get_default_store", None)
    try:
        return get() if get is not None else None
    except (RuntimeError, ValueError):
        return None


def _bind_defaults_before_the_group() -> None:
    """Imports torch.distributed.nn.functional while no group exists. Its functions bind
    `group=group.WORLD` as a default at import; imported after init_process_group (DDP
    imports it through Dynamo) they would hold the group for the process's life. Gloo's
    threads would then free their last tensors in the interpreter's shutdown, without
    the GIL, and abort the rank ('terminate called without an active exception')."""
    import torch.distributed.nn.functional  # noqa: F401


def _watch_the_launcher() -> None:
    """Ends this rank, as a failed run, within WATCH_S of its launcher's death: a
    launcher killed by SIGKILL stops no rank. A thread polls the parent pid
    (PR_SET_PDEATHSIG follows the parent *thread*, which torchrun does not keep) and
    interrupts the main thread with SIGUSR1, whose handler raises LauncherGone."""
    parent = os.getppid()
    if parent == 1 or threading.current_thread() is not threading.main_thread():
        return
    _LAUNCHER["pid"] = parent

    def gone(signum, frame):
        raise LauncherGone(launcher_gone())
    signal.signal(signal.SIGUSR1, gone)

    def watch():
        while os.getppid() == parent:
            time.sleep(WATCH_S)
        folder = os.environ.pop(ERRORS_ENV, None)
        if folder:
            shutil.rmtree(folder, ignore_errors=True)
        if not _LAUNCHER.get("ending"):
            os.kill(os.getpid(), signal.SIGUSR1)  # and _unstick_on_ending_signals wakes
        time.sleep(GRACE_S)
        os._exit(1)
    threading.Thread(target=watch, name="launcher-watch", daemon=True).start()


# The signals whose handlers end a rank's run: Ctrl-C's and SIGTERM's (core/signals.py;
# torchrun's SIGTERM after another rank failed) and the launcher watch's SIGUSR1.
ENDING_SIGNALS = frozenset({signal.SIGINT, signal.SIGTERM, signal.SIGUSR1})


def _unstick_on_ending_signals() -> None:
    """Under NCCL: STUCK_S after a signal that ends the run, unless the main thread has
    begun its early end, the group's communicators aborted from a thread. The main thread
    can sit in a CUDA call that does not return while the GPU waits on a collective whose
    peer is gone, so the signal's handler never runs; the abort ends the waiting kernels.
    This thread hears of the signal through Python's wakeup fd, which the C-level handler
    writes whatever the main thread is doing."""
    if threading.current_thread() is not threading.main_thread():
        return  # set_wakeup_fd is the main thread's
    read, write = os.pipe()
    os.set_blocking(write, False)  # a full pipe drops a byte, never blocks the handler
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    # A forked child (a data worker) would inherit the fd: its own signals must not read
    # as this rank's.
    os.register_at_fork(after_in_child=_no_wakeup_fd)

    def watch():
        while True:
            got = os.read(read, 64)  # one byte a signal that has a Python handler
            if not got:
                return
            if ENDING_SIGNALS.intersection(got):
                _unstick_after(STUCK_S)
                return
    threading.Thread(target=watch, name="stuck-watch", daemon=True).start()


def _no_wakeup_fd() -> None:
    try:
        signal.set_wakeup_fd(-1)
    except ValueError:  # forked from a thread Python does not take for the main one
        pass


def _unstick_after(seconds: float) -> None:
    """The NCCL group aborted unless the early end begins within `seconds`
    (_unstick_on_ending_signals says why)."""
    deadline = time.monotonic() + seconds
    while not _LAUNCHER.get("ending") and time.monotonic() < deadline:
        time.sleep(WATCH_S / 10)
    if not _LAUNCHER.get("ending"):
        abandon_nccl()


def stop_watching() -> None:
    """The run is ending already: the launcher's death must not raise into its early end
    (which dropped the folder it was keeping). The watch stays, to exit a rank stuck past
    GRACE_S."""
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGUSR1, signal.SIG_IGN)
    _LAUNCHER["ending"] = True


def launcher_gone() -> str | None:
    """What ended this rank's run if its launcher has died (its parent pid changed), else
    None: a peer's closed socket, met first, is not the cause then."""
    parent = _LAUNCHER.get("pid")
    if parent is None or os.getppid() == parent:
        return None
    return f"the launcher (pid {parent}) ended without stopping the job: this rank stopped"


# gloo's and NCCL's words for a collective that waited out its timeout ("Timed out waiting
# 3000ms for recv operation to complete", "Application timeout caused pair closure"; the
# NCCL watchdog's "collective operation timeout"; the store's "wait timeout after
# 20000ms" as the group starts), not a data loader's "timed out after 300 seconds".
TIMED_OUT = ("timed out waiting", "application timeout", "collective operation timeout",
             "wait timeout after")  # the last: the store's, as the group starts


def set_hang_timeout(seconds: float | None) -> None:
    """Every process group's collectives wait `seconds` for the other ranks from now on
    (None: START_TIMEOUT again). Under NCCL a collective waits on the GPU, so the host's
    waits for the GPU (core/waits.py) are bounded instead, and NCCL's watchdog, a
    backstop, gets twice as long and 10 s more."""
    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d
    if not dist.is_initialized():
        waits.set_bound(None)
        return
    nccl = dist.get_backend() == "nccl"
    waits.set_bound(seconds if nccl else None)
    if seconds is None:
        timeout = START_TIMEOUT
    else:
        timeout = timedelta(seconds=2 * seconds + 10 if nccl else seconds)
    for group in list(c10d._world.pg_map):
        c10d._set_pg_timeout(timeout, group)


def peer_stopped(exc: BaseException, rank: int, world: int) -> str | None:
    """The line of a rank whose collective timed out (--hang-timeout), naming the rank that
    stopped answering: one whose process is stopped (SIGSTOP, a debugger), else one that
    still runs without joining; None for another error."""
    if not any(word in str(e).lower() for e in _chain(exc) for word in TIMED_OUT):
        return None
    folder = launcher_folder()
    pids = {**job_notes.children_ranks(os.getppid()),  # this host's, by their launcher
            **(job_notes.rank_pids(folder) if folder is not None else {})}
    states = {peer: job_notes.process_state(pids.get(peer))
              for peer in range(world) if peer != rank}
    stopped = [p for p, state in states.items()
               if state in ("T", "t") or job_notes.was_stopped(p)]
    # Those still running that have not failed themselves (no line left): the hung ones.
    running = [p for p, state in states.items() if state not in (None, "Z", "X", "T", "t")
               and p not in stopped and left_line(folder, p) is None]
    if stopped:
        return (f"rank {stopped[0]} stopped answering: its process is stopped (SIGSTOP or "
                "a debugger), and this rank's collective waited --hang-timeout for it")
    if running:
        names = ", ".join(map(str, running))
        return (f"rank {names} stopped answering: running, but it did not join this "
                "rank's collective within --hang-timeout (hung?)")
    return (peer_line(rank, world) or  # this rank was the one stopped: a peer says so
            "a collective waited --hang-timeout for another rank, which never joined")


def peer_line(rank: int, world: int) -> str | None:
    """'rank N failed: <its line>' of the first other rank that left its line for the
    launcher (its cause, where this rank met only its end), else None."""
    return next((f"rank {peer} failed: {said}" for peer, said in _peer_lines(rank, world)),
                None)


def _peer_lines(rank: int, world: int):
    """(peer, its line) of the other ranks that left their line for the launcher."""
    folder = launcher_folder()
    for peer in range(world):
        said = left_line(folder, peer) if peer != rank else None
        if said is not None:
            yield peer, said


def the_users_stop(rank: int, world: int) -> str | None:
    """'interrupted (<signal>)' where the job is being stopped by the user: another rank
    ended on the user's Ctrl-C or SIGTERM (its line says so), or the launcher noted one.
    A rank can meet such a peer's closed socket before its own signal, which then comes
    inside the early end and is dropped there."""
    for _, said in _peer_lines(rank, world):
        if found := re.match(r"interrupted \([^)]*\)", said):
            return found.group(0)
    return "interrupted (the launcher got Ctrl-C or SIGTERM)" if job_notes.users_signal_noted() \
        else None


def caused_by_another(line: str) -> bool:
    """Whether a rank's line says another rank's end or stop was its cause: peer_gone's,
    peer_stopped's and peer_line's words (the launcher blames such a rank last)."""
    return "another rank" in line or re.search(r"\brank \d+ (failed|stopped answering)",
                                               line) is not None


def peer_cause(exc: BaseException, rank: int, world: int) -> str | None:
    """Why this rank's collective failed, where another rank is the cause: one that stopped
    answering (peer_stopped), or one that ended (peer_gone), in its own words where it left
    them."""
    gone = peer_gone(exc)
    return peer_stopped(exc, rank, world) or (gone and (peer_line(rank, world) or gone))


def _chain(exc: BaseException) -> list[BaseException]:
    """An exception and those it came from (its causes and contexts), each once."""
    chain = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


# What gloo and NCCL say when the rank at the other end of a collective has ended.
PEER_GONE = ("connection closed by peer", "connection reset by peer", "broken pipe",
             "connection was likely closed",
             "remote process exited", "communicator was aborted")


def peer_gone(exc: BaseException) -> str | None:
    """The line of a rank whose collective failed because another rank ended, else None
    (also where a Ctrl-C or SIGTERM is in the chain: every rank got it). The markers are
    searched through the whole chain: DDP's hook wraps gloo's message in a traceback."""
    chain = _chain(exc)
    if any(isinstance(e, KeyboardInterrupt) for e in chain):
        return None
    for marker in PEER_GONE:
        if any(marker in str(e).lower() for e in chain):
            return f"another rank ended ({marker}); this rank stopped"
    return None


@contextmanager
def _peers_alive(ranks: "Ranks"):
    """Another rank's end, or its stop, met here, as its one line (PeerGone, exit 1),
    not gloo's paragraph or a C++ traceback."""
    try:
        yield
    except RuntimeError as exc:  # torch's DistError and gloo's errors are RuntimeErrors
        line = peer_stopped(exc, ranks.rank, ranks.world) or peer_gone(exc)
        if line is None:
            raise
        raise PeerGone(line) from exc


def from_env() -> Ranks:
    """This process's place, from the variables torchrun sets."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return Ranks()
    return Ranks(int(os.environ["RANK"]), world, int(os.environ.get("LOCAL_RANK", "0")))


def per_host() -> int:
    """The ranks on this host (torchrun's LOCAL_WORLD_SIZE; the whole world without it)."""
    return int(os.environ.get("LOCAL_WORLD_SIZE", os.environ.get("WORLD_SIZE", "1")))


def hosts() -> int | None:
    """The hosts of the job (torchrun's GROUP_WORLD_SIZE: each host's launcher is one
    group), or None where no launcher said."""
    given = os.environ.get("GROUP_WORLD_SIZE")
    return int(given) if given else None


def stop() -> None:
    """Leaves the process group after a job that ended well, once every rank is done with
    it, and frees it while Python lives (_bind_defaults_before_the_group says why)."""
    dist = sys.modules.get("torch.distributed")
    if dist is not None and dist.is_available() and dist.is_initialized():
        _forget_what_holds_the_group()
        if dist.get_backend() == "nccl":  # its device named: torch warned on every rank
            import torch
            dist.barrier(device_ids=[torch.cuda.current_device()])
        else:
            dist.barrier()
        dist.destroy_process_group()


def abandon_nccl() -> None:
    """An early end under NCCL: the group's communicators aborted, LEAVE_S at most. A
    collective whose peer died or never joined waits on the GPU forever, and everything
    behind it on its stream, the rank's exit included; ncclCommAbort ends it. No
    collective follows an early end, so nothing is lost. tp's copies by copy engine wait on
    flags, which no abort ends: peer_copies.release_waits sets them."""
    dist = sys.modules.get("torch.distributed")
    with _ABANDONING:  # the early end's and the stuck-watch's: one abort, one release
        copies = sys.modules.get("training.peer_copies")  # loaded only where they were used
        if copies is not None:
            copies.release_waits()
        if dist is None or not (dist.is_available() and dist.is_initialized()):
            return
        abort = getattr(dist.distributed_c10d, "_abort_process_group", None)
        world = dist.distributed_c10d._get_default_group()
        begun = any(group is world for group in _ABANDONED)
        if dist.get_backend() == "nccl" and abort is not None and not begun:
            # The group held, not its id(), which a freed group's successor could reuse.
            _ABANDONED[:] = [world]  # begun: an abort past LEAVE_S is not started twice
            finished_within(abort, LEAVE_S, "abort the NCCL group")


_ABANDONING = threading.Lock()
_ABANDONED: list = []  # the default group whose abort has begun


def _leave_after_an_early_end() -> None:
    """At exit, a gloo group that an early end left joined is freed while Python lives
    (_bind_defaults_before_the_group says why), without waiting for the others. Freeing
    waits for queued collectives, and one may never finish (a Ctrl-C meets the ranks in
    different collectives): so it runs on a daemon thread, LEAVE_S at most, after which
    the rank exits at once with its command's code (its folder is already marked). Not
    NCCL's: abandon_nccl aborts that."""
    dist = sys.modules.get("torch.distributed")
    if dist is None or not (dist.is_available() and dist.is_initialized()):
        return  # stop() left it, or there was none
    abandon_nccl()  # an early end outside the harness's (the model's build, a study's)
    if dist.is_initialized() and dist.get_backend() == "gloo":
        _forget_what_holds_the_group()
        if not finished_within(dist.destroy_process_group, LEAVE_S,
                               "leave the process group"):
            from core.commands import leaving_code
            for stream in (sys.stdout, sys.stderr):
                stream.flush()
            os._exit(leaving_code())


def _forget_what_holds_the_group() -> None:
    """Drops the model that make compare keeps between its runs (model/build.py): its
    DDP wrapper holds the process group, which then outlived destroy_process_group."""
    build = sys.modules.get("model.build")  # loaded only where a model was built
    if build is not None:
        import gc
        build.forget_kept_model()
        # Dropping the reference frees DDP on CPU ranks (tested); a compiled runner may
        # sit in reference cycles, which are freed here rather than at exit.
        gc.collect()
