"""Starts a script on N ranks with torchrun, and turns a failed job into one line.

    python3 -m training.launch --nproc 2 train.py --loss padded     # make profile GPUS=2
    # several hosts (make profile GPUS=8 NODES=2 RDZV=host0:29500), the same on each host:
    python3 -m training.launch --nproc 8 --nnodes 2 --rdzv host0:29500 train.py ...

torchrun itself (torch.distributed.run, no restarts) starts the ranks: one process per GPU
with NCCL, or, without GPUs, N CPU processes with gloo (so a CPU machine runs the
distributed path too). One host is --standalone; several meet through torchrun's own c10d
rendezvous at --rdzv (a host:port every host reaches; the first launcher there hosts it),
each host starting its own --nproc ranks (they may differ), the world being their sum.
When a rank fails (an exception, a user error in its batch, a killed process), torchrun
stops every other rank within its monitor interval (0.1 s); this launcher then prints the
line of the rank that failed first, as that rank left it (training/ranks.py), instead of
torchrun's report, and exits with its code: 2 for a user error, 130 for Ctrl-C, 1
otherwise. Ctrl-C stops every rank.
"""

import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

from core.commands import run_command
from core.errors import UserError, report_errors
from training.ranks import ERRORS_ENV

USAGE = ("usage: python3 -m training.launch --nproc N [--nnodes H --rdzv HOST:PORT] SCRIPT "
         "[ARGS...]")


def _whole(value: str, what: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise UserError(f"{what} must be a whole number, not {value!r}") from None
    if number < 1:
        raise UserError(f"{what} must be at least 1, not {number}")
    return number


def parse(argv: list[str]) -> tuple[int, list[str], list[str]]:
    """(ranks on this host, torchrun's rendezvous arguments, the script and its args)."""
    if len(argv) < 3 or argv[0] != "--nproc":
        raise UserError(USAGE)
    nproc, rest = _whole(argv[1], "GPUS"), argv[2:]
    nodes, endpoint = 1, ""
    while rest and rest[0] in ("--nnodes", "--rdzv"):
        if len(rest) < 3:
            raise UserError(USAGE)
        if rest[0] == "--nnodes":
            nodes = _whole(rest[1], "NODES")
        else:
            endpoint = rest[1]
        rest = rest[2:]
    if nodes == 1:
        if endpoint:
            raise UserError(f"--rdzv {endpoint} meets several hosts: give --nnodes too "
                            "(NODES=H), or leave it out to run on this host alone")
        return nproc, ["--standalone"], rest
    host, _, port = endpoint.rpartition(":")
    if not (host and port.isdigit()):
        raise UserError(f"NODES={nodes} needs RDZV=HOST:PORT, an address every host reaches "
                        f"(the first host's, say), not {endpoint!r}")
    # The job's id: every host of one job gives the same, from the endpoint.
    return nproc, [f"--nnodes={nodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}",
                   f"--rdzv-id=ragged-{port}"], rest


def check_devices(nproc: int) -> None:
    import torch
    if torch.cuda.is_available() and torch.cuda.device_count() < nproc:
        raise UserError(f"GPUS={nproc} but this machine has {torch.cuda.device_count()} "
                        "GPU(s): ask for at most that many")


def first_failure(failures: dict) -> int:
    """The rank whose end ended the job. A rank that loses its peer fails too, often at
    the same poll of torchrun's, with a line about the peer or about its own data
    workers (the SIGTERM torchrun sends reaches them); torchrun's choice, the earliest
    timestamp in whole seconds with rank 0 winning a tie, then named the wrong rank
    (rank 1 exiting at its start was reported as 'rank 0 failed: killed by SIGTERM'). So:
    a rank killed by a signal other than torchrun's SIGTERM, then one that ended on its
    own (exit 2, a user error, first), and last those torchrun stopped (SIGTERM, or 130:
    the run's own end on it); the earliest, lowest rank first within each."""
    def order(rank):
        failure = failures[rank]
        killed = failure.exitcode < 0 and failure.exitcode != -signal.SIGTERM
        stopped = failure.exitcode in (-signal.SIGTERM, 130)
        return (not killed, stopped, failure.exitcode != 2, failure.timestamp, rank)
    return min(failures, key=order)


def explain(rank: int, failure, folder: Path) -> tuple[str, int]:
    """The line and exit code for the rank torchrun saw fail first."""
    left = folder / f"rank{rank}.txt"
    if left.exists():  # the rank's own line, as train.py would have printed it
        line = left.read_text().strip()
    elif failure.exitcode < 0:
        line = f"killed by {failure.signal_name()}"
    else:
        line = f"exited with code {failure.exitcode} (see its output above)"
    code = failure.exitcode if failure.exitcode in (1, 2, 130) else 1
    return f"rank {rank} failed: {line}; every rank was stopped", code


def quiet_torchrun() -> None:
    """torchrun's agent logs each rank it stops, the signal it got and a report of the
    failure, which the one line replaces. Its modules set their loggers' levels from
    LOGLEVEL when imported, so this runs before they are."""
    os.environ["LOGLEVEL"] = "CRITICAL"
    for name in list(logging.root.manager.loggerDict):
        if name.startswith("torch.distributed"):
            logging.getLogger(name).setLevel(logging.CRITICAL)


def launch(nproc: int, rendezvous: list[str], script: list[str]) -> int:
    if "-h" in script or "--help" in script:  # once, not once a rank
        return subprocess.call([sys.executable, *script])
    quiet_torchrun()
    from torch.distributed.elastic.multiprocessing.api import SignalException
    from torch.distributed.elastic.multiprocessing.errors import ChildFailedError
    from torch.distributed.run import get_args_parser, run
    quiet_torchrun()  # and the loggers those imports made
    check_devices(nproc)
    folder = Path(tempfile.mkdtemp(prefix="ragged-ranks-"))
    os.environ[ERRORS_ENV] = str(folder)
    # torchrun would set 1 thread per rank and print a banner saying so.
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    # --log-dir: torchrun's per-rank error files go under the folder removed below, not
    # into a /tmp/torchelastic_* folder of their own that no one removes.
    args = get_args_parser().parse_args([*rendezvous, f"--nproc-per-node={nproc}",
                                         "--max-restarts=0", f"--log-dir={folder / 'torchrun'}",
                                         *script])
    try:
        run(args)
        return 0
    except ChildFailedError as exc:
        rank = first_failure(exc.failures)
        failure = exc.failures[rank]
        line, code = explain(rank, failure, folder)
        print(f"error: {line}", file=sys.stderr)
        return code
    except (KeyboardInterrupt, SignalException):
        main_line = folder / "rank0.txt"
        where = main_line.read_text().strip() if main_line.exists() else "interrupted"
        print(f"error: {where}; every rank was stopped", file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def main(argv=None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    return report_errors(lambda: launch(*parse(argv)))


if __name__ == "__main__":
    # SIGTERM stops the job as Ctrl-C does (torchrun passes it to every rank).
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    run_command(main, "every rank was stopped", stop_signals=False)  # its own handling
