"""Several hosts meeting at RDZV=HOST:PORT: the host resolved before torchrun sees it, the
wait bounded and said, and Ctrl-C honoured while the launcher waits (torchrun's c10d
rendezvous can otherwise hang in silence, deaf to signals). Its design in full: docs/design.md."""

import os
import select
import signal
import socket
import sys
import threading
import time

WAIT_S = 300          # the default bound on the rendezvous (RDZV_WAIT)
SAY_EVERY_S = 60      # how often a waiting launcher says it still waits
GRACE_S = 1.0         # the main thread's own chance to end on a signal
BACKSTOP_S = 10.0     # past the join timeout, for a read that no timeout bounds
_SPOKEN = threading.Lock()  # one line, from whichever thread ends the launcher
STARTED = threading.Event()  # set once the launcher has seen its ranks


def check_host(endpoint: str) -> str | None:
    """None if HOST of HOST:PORT resolves, else why not (one line's worth)."""
    host, _, port = endpoint.rpartition(":")
    try:
        socket.getaddrinfo(host, int(port), type=socket.SOCK_STREAM)
    except (socket.gaierror, UnicodeError) as exc:
        return f"RDZV={endpoint}: cannot resolve {host!r} ({getattr(exc, 'strerror', exc)})"
    return None


def conf(wait_s: int) -> str:
    """torchrun's --rdzv-conf: join within wait_s; a store read waits at most a minute."""
    return f"join_timeout={wait_s},read_timeout={min(60, wait_s)}"


def ranks_started() -> bool:
    """Whether this launcher has a child process (torchrun starts the ranks only after
    the rendezvous). True where /proc cannot say: then the thread never ends anything."""
    me = str(os.getpid())
    try:
        pids = [p for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return True
    for pid in pids:
        try:
            with open(f"/proc/{pid}/stat") as f:
                # pid (comm) state ppid ...; comm may hold spaces and parentheses.
                if f.read().rsplit(")", 1)[1].split()[1] == me:
                    return True
        except (OSError, IndexError):
            continue
    return False


def speak_once(line: str) -> bool:
    """Prints the launcher's one line unless the other thread has; False if it had."""
    if not _SPOKEN.acquire(blocking=False):
        return False
    print(f"error: {line}", file=sys.stderr, flush=True)
    return True


def watch(endpoint: str, nodes: int, wait_s: int, cleanup) -> None:
    """Starts the watching thread (call from the main thread, before torchrun's run)."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    signal.set_wakeup_fd(write, warn_on_full_buffer=False)
    print(f"waiting up to {wait_s} s for {nodes} hosts to join at {endpoint} "
          "(RDZV_WAIT=seconds to change)", file=sys.stderr, flush=True)
    started = time.monotonic()

    def end(line: str, code: int):
        if speak_once(line):
            cleanup()
            os._exit(code)

    def loop():
        said, signalled = started, None
        while True:
            ready, _, _ = select.select([read], [], [], 0.5)
            if ready and os.read(read, 64) and signalled is None:
                signalled = time.monotonic()
            if ranks_started():
                STARTED.set()
                break
            now = time.monotonic()
            where = f"while waiting for the rendezvous at {endpoint}; no rank had started"
            if signalled is not None and now - signalled > GRACE_S:
                end(f"stopped {where}", 130)
            if now - started > wait_s + BACKSTOP_S:
                end(f"no answer from the rendezvous at {endpoint} in {wait_s} s: the other "
                    f"hosts did not join, or the port is another service's (RDZV_WAIT="
                    "seconds to wait longer)", 1)
            if now - said >= SAY_EVERY_S:
                said = now
                print(f"still waiting for {nodes} hosts at {endpoint}: {now - started:.0f} s "
                      f"of {wait_s} s", file=sys.stderr, flush=True)
        while True:  # ranks run: keep the fd drained, torchrun handles the signals
            os.read(read, 64)
    threading.Thread(target=loop, name="rendezvous-watch", daemon=True).start()
