"""make test-gpu: every GPU-marked test and compute-sanitizer over the kernels, run side by
side on one GPU, with one verdict. make test: the CPU suite the same way, 2 workers and
no sanitizer (--marker "not browser").

    python3 -m tests.gpu_suite [--workers 6] [--marker gpu] [--logs DIR] [--no-sanitizer]
                               [pytest args]

Most of the suite's time is Triton compiling kernels on the host (an fp32 kernel's IEEE
dots unroll into FMAs: a minute or more for some), one core each, while the GPU waits. So
--workers pytest processes share the suite (tests/claims.py: each test runs in the first
worker to reach it, the long ones spread as they come) and compute-sanitizer runs beside
them. Each writes a log and a JUnit file into --logs; at the end come the failures in
full, the slowest tests, the totals and the wall time. Exit 1 if a test or the sanitizer
failed, 130 on Ctrl-C (every part stopped), 0 otherwise. Tests marked `alone` read the
whole machine's state (what is left in /dev/shm): they run after the others, in one
worker.
"""

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

from core.signals import stop_once
from tests.claims import CLAIMED_ELSEWHERE, groups_folder

REPO = Path(__file__).resolve().parent.parent
SLOWEST = 20  # the slowest tests printed at the end, with their times
SANITIZER = ["compute-sanitizer", "--tool", "memcheck", "--error-exitcode", "1",
             sys.executable, "tests/sanitize_kernels.py"]


def parts(args, pytest_args: list[str], logs: Path) -> dict[str, list[str]]:
    """name -> command line of each part that runs side by side."""
    commands = {f"worker{i}": _pytest(_and(args.marker, "not alone"), f"worker{i}",
                                      pytest_args, logs)
                for i in range(args.workers)}
    if not args.no_sanitizer:
        commands["sanitizer"] = SANITIZER
    return commands


def alone(args, pytest_args: list[str], logs: Path) -> dict[str, list[str]]:
    """The one part that runs after the others: the tests marked alone."""
    return {"worker-alone": _pytest(_and(args.marker, "alone"), "worker-alone", pytest_args,
                                    logs)}


def _and(marker: str, more: str) -> str:
    return f"({marker}) and {more}" if marker else more


def _pytest(marker: str, name: str, pytest_args: list[str], logs: Path) -> list[str]:
    # A test still running after 8 minutes writes every thread's stack into its log.
    return [sys.executable, "-m", "pytest", "-q", "-m", marker, "-p", "tests.claims",
            "-p", "no:cacheprovider", "-o", "faulthandler_timeout=480",
            f"--junitxml={logs / f'{name}.xml'}",
            *(pytest_args or ["tests"])]


# The file the workers lock around ncu and the energy counter (tests.helpers.
# gpu_counters_alone), beside the claims' folder: a file in it would count as a test.
COUNTERS = "GPU_COUNTERS_LOCK"


def counters_lock(claims: Path) -> Path:
    return claims.with_name(claims.name + ".lock")


def run_side_by_side(commands: dict, logs: Path, claims: Path) -> dict[str, int]:
    """Starts every part, says every minute how many tests have started and when each part
    ends; returns each part's exit code. Ctrl-C or SIGTERM stops every part first."""
    path = os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))
    env = {**os.environ, "CLAIMS_DIR": str(claims), COUNTERS: str(counters_lock(claims)),
           "PYTHONUNBUFFERED": "1", "PYTHONPATH": path}
    # Each worker's share of the cores for torch's threads (as training/launch.py gives a
    # rank its share): two workers of 2 threads each on 2 cores made OpenMP's threads
    # spin against each other, and make compare's test took 330 s instead of 26.
    workers = sum(1 for name in commands if name.startswith("worker"))
    env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // max(workers, 1))))
    # Inductor compiles in each worker's own process, not in a pool of its own: 16
    # workers started 16 pools of 16, and on an H200 (torch 2.11) one worker's test of
    # the compiled_packed loss still waited 6 minutes after every other part had ended,
    # until the call's limit: likely the hang pytorch/pytorch#189290 mends (a pool whose
    # helper died never answers). The workers are the suite's parallelism.
    env.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
    started = said = time.monotonic()
    jobs = {name: subprocess.Popen(argv, cwd=REPO, env=env, stderr=subprocess.STDOUT,
                                   stdout=(logs / f"{name}.log").open("w"),
                                   start_new_session=True)
            for name, argv in commands.items()}
    codes = {}
    try:
        while len(codes) < len(jobs):
            time.sleep(0.5)
            if time.monotonic() - said > 60:
                said = time.monotonic()
                print(f"  {said - started:.0f} s: {len(os.listdir(claims))} tests started",
                      flush=True)
            for name, proc in jobs.items():
                if name not in codes and proc.poll() is not None:
                    codes[name] = proc.returncode
                    line = last_line(logs / f"{name}.log")
                    print(f"  {name} ended (exit {proc.returncode}) at "
                          f"{time.monotonic() - started:.0f} s: {line}", flush=True)
    finally:
        stop(jobs.values())
    return codes


def stop(procs) -> None:
    """Each part still running, with what it started: Ctrl-C to its process group (pytest
    tears its fixtures down), then SIGKILL after 10 s. The parts run in sessions of their
    own, so a Ctrl-C in the terminal reaches them only through here."""
    running = [p for p in procs if p.poll() is None]
    for proc in running:
        os.killpg(proc.pid, signal.SIGINT)
    deadline = time.monotonic() + 10
    for proc in running:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def outcomes(junit_files: list[Path]) -> dict[str, tuple[str, float]]:
    """nodeid -> (outcome, seconds) over every worker: the worker that ran a test says how
    it went; a test every worker skipped as claimed elsewhere does not count."""
    found = {}
    for path in junit_files:
        try:
            cases = list(ET.parse(path).iter("testcase"))
        except (FileNotFoundError, ET.ParseError):  # a worker that crashed, or was killed
            continue  # as it wrote the file: its exit code says so
        for case in cases:
            outcome = "passed"
            for kind in ("failure", "error", "skipped"):
                element = case.find(kind)
                if element is not None:
                    if CLAIMED_ELSEWHERE in element.get("message", ""):
                        outcome = None
                    elif element.get("type") == "pytest.xfail":
                        outcome = "xfailed"
                    else:
                        outcome = kind
                    break
            if outcome:
                found[f"{case.get('classname')}::{case.get('name')}"] = (
                    outcome, float(case.get("time", 0)))
    return found


def junit_name(nodeid: str) -> str:
    """A pytest node id as the JUnit files name it (outcomes' keys):
    path/to/test_x.py::Class::test[id] -> path.to.test_x.Class::test[id]."""
    path, *rest = nodeid.split("::")
    return ".".join([path.removesuffix(".py").replace("/", "."), *rest[:-1]]) + "::" + rest[-1]


def in_flight(claims: Path, logs: Path) -> list[str]:
    """The tests a worker had started and not ended when the suite was stopped: claimed
    (tests/claims.py writes the id into its claim), with no outcome in any JUnit file."""
    ended = outcomes(sorted(logs.glob("worker*.xml")))
    claimed = (p.read_text() for p in claims.iterdir())
    return sorted(name for name in map(junit_name, filter(None, claimed)) if name not in ended)


def last_line(log: Path) -> str:
    lines = [line for line in log.read_text(errors="replace").splitlines() if line.strip()]
    return lines[-1] if lines else "(no output)"


def failure_sections(log: Path) -> str:
    """pytest's ERRORS and FAILURES sections of a worker's log; the log's last 40 lines
    where it has none (the sanitizer, a worker that crashed)."""
    text = log.read_text(errors="replace")
    for marker in ("= ERRORS =", "= FAILURES ="):
        if marker in text:
            start_at = text.rfind("\n", 0, text.index(marker)) + 1
            end_at = text.find("= short test summary info =", start_at)
            return text[start_at:end_at if end_at > 0 else None]
    return "\n".join(text.splitlines()[-40:])


def report(codes: dict, results: dict, logs: Path, wall: float,
           title: str = "make test-gpu") -> int:
    """The failures in full, the slowest tests, the totals; the exit code."""
    # pytest's exit 5: a worker that ran no test (the others took them all).
    broken = [n for n, c in codes.items() if c and not (n.startswith("worker") and c == 5)]
    for name in broken:
        print(f"--- {name} (exit {codes[name]}):\n{failure_sections(logs / f'{name}.log')}")
    print("slowest tests (s, setup + call + teardown, in a worker beside the others):")
    for name, (outcome, seconds) in sorted(results.items(), key=lambda kv: -kv[1][1])[:SLOWEST]:
        print(f"  {seconds:7.1f}  {outcome:7s} {name}")
    failed = sorted(n for n, (o, _) in results.items() if o in ("failure", "error"))
    for name in failed:
        print(f"FAILED {name}")
    counts = {}
    for outcome, _ in results.values():
        counts[outcome] = counts.get(outcome, 0) + 1
    summary = ", ".join(f"{v} {k}" for k, v in sorted(counts.items())) or "no tests"
    if "sanitizer" in codes:
        summary += "; compute-sanitizer " + ("FAILED" if codes["sanitizer"] else "passed")
    print(f"{title}: {summary}, {wall:.0f} s wall; logs in {logs}", flush=True)
    return 1 if failed or broken or not results else 0


def what_is_missing(args) -> str | None:
    """Why the suite cannot run here, in one line, or None. --marker other than gpu (the
    runner's own test) needs no GPU."""
    if args.marker == "gpu":
        import torch
        if not torch.cuda.is_available():
            return ("make test-gpu needs a CUDA GPU; `make test` runs the CPU suite (the "
                    "GPU tests skipped)")
    if not args.no_sanitizer and shutil.which(SANITIZER[0]) is None:
        return (f"{SANITIZER[0]} (the CUDA toolkit) is not on PATH: install it, or run the "
                "tests alone with ARGS=--no-sanitizer")
    return None


def machine_pace() -> str:
    """How long a fresh process takes to import torch. Half the CPU suite's time is in
    tests that start such processes (launchers, ranks, studies), so its time moves with
    this figure from one day or machine to the next (results/correctness.md). Printed to
    compare runs by."""
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", "import torch"], capture_output=True)
    seconds = time.monotonic() - started
    return (f"this machine imports torch in a fresh process in {seconds:.2f} s" if
            done.returncode == 0 else "this machine's python cannot import torch")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python3 -m tests.gpu_suite",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workers", type=int, default=6,
                        help="pytest processes sharing the tests (default 6)")
    parser.add_argument("--marker", default="gpu", help="pytest's -m (default gpu)")
    parser.add_argument("--logs", type=Path, help="folder of the logs (default: a new "
                        "profiles/test-gpu-<UTC time>/)")
    parser.add_argument("--no-sanitizer", action="store_true",
                        help="the tests alone, without compute-sanitizer")
    args, pytest_args = parser.parse_known_args(argv)
    if args.workers < 1:
        parser.error("--workers must be at least 1")
    missing = what_is_missing(args)
    if missing:
        print(f"error: {missing}", file=sys.stderr)
        return 2
    folder = "test-gpu" if args.marker == "gpu" else "test"
    logs = args.logs or REPO / "profiles" / time.strftime(f"{folder}-%Y%m%d-%H%M%S",
                                                          time.gmtime())
    logs.mkdir(parents=True, exist_ok=True)
    name = "make test-gpu" if args.marker == "gpu" else "make test"
    print(f"{name}: {args.workers} pytest workers"
          f"{'' if args.no_sanitizer else ' and compute-sanitizer'} side by side, then the "
          f"tests marked alone; logs in {logs}", flush=True)
    claims = Path(tempfile.mkdtemp(prefix="suite-claims-"))
    started = time.monotonic()
    stop_once()  # Ctrl-C and SIGTERM as one KeyboardInterrupt
    try:
        print(f"{machine_pace()} (the suite's time follows it)", flush=True)
        codes = run_side_by_side(parts(args, pytest_args, logs), logs, claims)
        codes.update(run_side_by_side(alone(args, pytest_args, logs), logs, claims))
    except KeyboardInterrupt:
        running = in_flight(claims, logs)
        what = (f" with {len(running)} test{'s' * (len(running) > 1)} running "
                f"({', '.join(running[:5])}{', ...' if len(running) > 5 else ''})"
                if running else "")
        print(f"error: interrupted{what}: every part was stopped; logs in {logs}",
              file=sys.stderr)
        return 130
    finally:
        shutil.rmtree(claims, ignore_errors=True)
        shutil.rmtree(groups_folder(claims), ignore_errors=True)
        counters_lock(claims).unlink(missing_ok=True)
    return report(codes, outcomes(sorted(logs.glob("worker*.xml"))), logs,
                  time.monotonic() - started, name)


if __name__ == "__main__":
    sys.exit(main())
