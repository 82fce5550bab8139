"""The several-rank promises on NCCL ranks, one per GPU of the machine (test_launch.py holds
them on gloo): a killed rank, rank 0 too, ends the job within seconds with one line that
names it; a stopped rank is named within --hang-timeout; Ctrl-C to the job stops every
rank (exit 130); a killed launcher takes its ranks with it. Under NCCL a dead peer's
collective never fails, it hangs: every later kernel of the survivors' streams waits
behind it, and a rank that waited for the GPU in CUDA's blocking call answered torchrun's
SIGTERM only to its SIGKILL, 30 s later (core/waits.py)."""

import json
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
import torch

from tests.helpers import REPO, SMALL
from tests.training.test_launch import _ended, _finish, _ranks_of

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(
    torch.cuda.device_count() < 2, reason="needs two GPUs (nvidia-h100-x2)")]
GPUS = torch.cuda.device_count()
# Steps of a few ms after a short profiled window, for minutes: the job is killed in its
# steady state, where the host runs ahead of the GPU and waits on it.
LONG = [*SMALL, "--batch-size", "32", "--steps", "100000", "--dataset-length", "100000000"]
# The bound: the gloo ranks end within 4 s; NCCL's teardown and the GPU suite's other
# workers beside it get more, and torchrun's close timeout (30 s) stays well outside it.
BOUND_S = 15.0
# tp (the default design on one host) moves its features and dx by NCCL, or with
# --copy-engine-collectives on by copy engines whose stream waits on a flag the peer writes
# (training/peer_copies.py): a wait that no NCCL timeout or abort can end. Every promise is
# held under both.
COLLECTIVES = {"nccl": ["--copy-engine-collectives", "off"],
               "copy-engines": ["--copy-engine-collectives", "on"]}


@pytest.fixture(params=list(COLLECTIVES))
def collectives(request) -> list[str]:
    return COLLECTIVES[request.param]


def _launch(out, collectives, *args, **popen):
    return subprocess.Popen([sys.executable, "-u", "-m", "training.launch", "--nproc",
                             str(GPUS), "train.py", *LONG, *collectives, *args,
                             "--out-dir", str(out),
                             "--run-name", "job"], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, **popen)


def _steady(proc) -> dict[int, int]:
    """Waits for the job's steady state (past its profiled window); its ranks' pids."""
    for line in proc.stdout:
        if "step 12/" in line:
            break
    ranks = _ranks_of(proc.pid)
    assert set(ranks) == set(range(GPUS)), ranks
    return ranks


def _stacks_if_stuck(pids) -> threading.Timer:
    """Half the bound after the event, every rank still running prints its Python stacks
    (core/signals.stop_once registers SIGUSR2 with faulthandler): a hang's place lands in the
    failure's message."""
    def dump():
        for pid in pids:
            if not _ended(pid):
                os.kill(pid, signal.SIGUSR2)
    timer = threading.Timer(BOUND_S / 2, dump)
    timer.start()
    return timer


def _summary(folder) -> dict:
    return json.loads((folder / "summary.json").read_text())


@pytest.mark.parametrize("victim", [0, 1])
def test_a_killed_nccl_rank_ends_the_job_within_seconds(tmp_path, collectives, victim):
    proc = _launch(tmp_path, collectives)
    ranks = _steady(proc)
    os.kill(ranks[victim], signal.SIGKILL)
    killed = time.monotonic()
    _stacks_if_stuck(ranks.values())
    code, _, err = _finish(proc, timeout=120)
    took = time.monotonic() - killed
    print(f"NCCL: the job ended {took:.1f} s after rank {victim} was killed")
    assert took < BOUND_S, (f"the job outlived its killed rank {victim} by {took:.1f} s",
                            err)
    folder = tmp_path / "job-failed"
    where = f"; its run folder is {folder}" if victim == 0 else ""
    assert code == 1 and err == [f"error: rank {victim} failed: killed by SIGKILL; every "
                                 f"rank was stopped{where}"], err
    assert [p.name for p in tmp_path.iterdir()] == ["job-failed"]
    assert _summary(folder)["status"] == "failed"


def test_ctrl_c_stops_every_nccl_rank(tmp_path, collectives):
    def as_a_terminal():
        os.setsid()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
    proc = _launch(tmp_path, collectives, preexec_fn=as_a_terminal)
    ranks = _steady(proc)
    os.killpg(proc.pid, signal.SIGINT)  # what Ctrl-C in a terminal sends
    sent = time.monotonic()
    _stacks_if_stuck(ranks.values())
    code, _, err = _finish(proc, timeout=120)
    took = time.monotonic() - sent
    print(f"NCCL: the job ended {took:.1f} s after Ctrl-C")
    assert took < BOUND_S and code == 130, (took, err)
    assert len(err) == 1 and err[0].startswith("error: interrupted ("), err
    assert [p.name for p in tmp_path.iterdir()] == ["job-interrupted"]
    assert _summary(tmp_path / "job-interrupted")["status"] == "interrupted"
    assert all(_ended(pid) for pid in ranks.values())


def test_a_killed_launcher_ends_its_nccl_ranks_within_seconds(tmp_path, collectives):
    proc = _launch(tmp_path, collectives)
    ranks = _steady(proc)
    os.kill(proc.pid, signal.SIGKILL)
    killed = time.monotonic()
    _stacks_if_stuck(ranks.values())
    _, err = proc.communicate(timeout=60)  # the ranks hold its pipes: they end first
    while not all(_ended(pid) for pid in ranks.values()) and time.monotonic() - killed < 60:
        time.sleep(0.1)
    took = time.monotonic() - killed
    print(f"NCCL: the ranks ended {took:.1f} s after their launcher was killed")
    assert all(_ended(pid) for pid in ranks.values()), "a rank outlived its launcher"
    assert took < BOUND_S, (took, err[-5000:])
    assert [p.name for p in tmp_path.iterdir()] == ["job-failed"]
    assert "the launcher (pid" in _summary(tmp_path / "job-failed")["reason"]


@pytest.mark.parametrize("stopped", [0, 1])
def test_a_stopped_nccl_rank_is_named_within_the_hang_timeout(tmp_path, collectives,
                                                              stopped):
    """SIGSTOP, no SIGCONT: the other ranks' collectives wait on the GPU, where no gloo
    timeout fires; their hosts' waits for the GPU end after --hang-timeout instead
    (core/waits.py), each naming the stopped rank, and NCCL's watchdog (twice as long)
    never prints."""
    proc = _launch(tmp_path, collectives, "--hang-timeout", "3")
    ranks = _steady(proc)
    os.kill(ranks[stopped], signal.SIGSTOP)
    sent = time.monotonic()
    code, _, err = _finish(proc, timeout=120)
    took = time.monotonic() - sent
    print(f"NCCL: the job ended {took:.1f} s after rank {stopped} was stopped "
          "(--hang-timeout 3)")
    said = (f"rank {stopped} stopped answering: its process is stopped (SIGSTOP or a "
            "debugger)")
    assert code == 1 and len(err) == 1 and said in err[0], err
    assert err[0].startswith("error: rank ") and f"rank {stopped} failed" not in err[0], err
    assert took < 3 + BOUND_S, took
    assert [p.name for p in tmp_path.iterdir()] == ["job-failed"]
    assert said in _summary(tmp_path / "job-failed")["reason"]
    assert all(_ended(pid) for pid in ranks.values())
