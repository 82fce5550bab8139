"""Several hosts meeting at a rendezvous (training/rendezvous.py), on CPU: a port held by
a service that never answers, a peer that never comes, Ctrl-C or SIGTERM while waiting.
Each ends within a bound, with the wait said first and one line at the end."""

import signal
import socket
import subprocess
import sys
import time

import pytest

from tests.helpers import REPO, our_lines
from tests.training.test_launch import RANK_ARGS

WAITING = "waiting up to {wait} s for 2 hosts to join at {endpoint} (RDZV_WAIT=seconds to change)"


def _deaf_port() -> socket.socket:
    """A port whose listener never answers: the kernel completes each connection from
    the backlog, and nothing reads or writes."""
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen(16)
    return holder


def _free_endpoint() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"127.0.0.1:{s.getsockname()[1]}"


def _host(tmp_path, endpoint: str, wait: int, ignoring=()) -> subprocess.Popen:
    """One host's launcher of a job of two hosts, one rank each; started with the signals
    `ignoring` ignored, as a shell's background job starts with SIGINT ignored."""
    def ignore():
        for signum in ignoring:
            signal.signal(signum, signal.SIG_IGN)
    return subprocess.Popen([sys.executable, "-u", "-m", "training.launch", "--nproc", "1",
                             "--nnodes", "2", "--rdzv", endpoint, "--wait", str(wait),
                             "train.py", *RANK_ARGS, "--out-dir", str(tmp_path)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=ignore if ignoring else None)


def _first_line(proc) -> str:
    return proc.stderr.readline().rstrip("\n")


@pytest.mark.parametrize("signum,inherited", [(signal.SIGINT, False), (signal.SIGTERM, False),
                                              (signal.SIGINT, True)])
def test_a_signal_ends_a_launcher_stuck_on_a_port_that_never_answers(tmp_path, signum,
                                                                     inherited):
    """The launcher sat 731 s in TCPStore's socket read, where Python's handlers never
    run: Ctrl-C and SIGTERM did nothing. inherited: started with SIGINT ignored (the
    fresh-clone CI run as a background job: Python leaves an inherited SIG_IGN alone, and
    the SIGINT did nothing until the launcher set its handler itself)."""
    holder = _deaf_port()
    endpoint = f"127.0.0.1:{holder.getsockname()[1]}"
    try:
        proc = _host(tmp_path, endpoint, 300, ignoring=(signum,) if inherited else ())
        assert _first_line(proc) == WAITING.format(wait=300, endpoint=endpoint)
        time.sleep(3)  # into the store's read
        proc.send_signal(signum)
        sent = time.time()
        _, err = proc.communicate(timeout=30)
        took = time.time() - sent
    finally:
        holder.close()
    print(f"the launcher ended {took:.1f} s after the signal")
    assert proc.returncode == 130 and our_lines(err) == [
        f"error: stopped while waiting for the rendezvous at {endpoint}; no rank had "
        "started"], err
    assert took < 5
    assert not list(tmp_path.iterdir())


def test_a_port_that_never_answers_ends_the_wait_within_its_bound(tmp_path):
    holder = _deaf_port()
    endpoint = f"127.0.0.1:{holder.getsockname()[1]}"
    t0 = time.time()
    try:
        proc = _host(tmp_path, endpoint, 2)
        _, err = proc.communicate(timeout=60)
    finally:
        holder.close()
    took = time.time() - t0
    lines = our_lines(err)
    assert proc.returncode == 1 and len(lines) == 2, err
    assert lines[0] == WAITING.format(wait=2, endpoint=endpoint)
    assert lines[1].startswith("error: ") and endpoint in lines[1] and " 2 s" in lines[1]
    assert took < 2 + 10 + 15  # the wait, the backstop past it, and a loaded machine


def test_a_peer_that_never_comes_is_waited_for_aloud_and_within_a_bound(tmp_path):
    endpoint = _free_endpoint()
    t0 = time.time()
    proc = _host(tmp_path, endpoint, 2)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and our_lines(err) == [
        WAITING.format(wait=2, endpoint=endpoint),
        f"error: the rendezvous at {endpoint} did not complete in 2 s (the other hosts did "
        "not all join; RDZV_WAIT=seconds to wait longer)"], err
    assert time.time() - t0 < 30
