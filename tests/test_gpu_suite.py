"""make test-gpu's runner (tests/gpu_suite.py and the claims plugin, tests/claims.py) on a
suite of its own: several workers share it, each test runs once, and the verdict, the
totals and the failures are the whole suite's."""

import os
import re
import signal
import subprocess
import sys
import time

from tests.gpu_suite import outcomes
from tests.helpers import REPO

SUITE = """
import time
import pytest

@pytest.fixture(scope="module")
def shared():
    return []

@pytest.mark.parametrize("i", range(12))
def test_slow(i, shared):
    time.sleep(0.3)

def test_fails():
    assert 1 == 2

@pytest.mark.skip(reason="skipped for a reason of its own")
def test_skipped():
    pass

@pytest.mark.xfail(strict=True)
def test_xfails():
    assert False
"""


def _suite(test_file, logs, workers: int = 2, env=None) -> subprocess.CompletedProcess:
    """The runner over one test file, without the sanitizer or a marker."""
    return subprocess.run([sys.executable, "-m", "tests.gpu_suite", "--workers", str(workers),
                           "--marker", "", "--no-sanitizer", "--logs", str(logs),
                           str(test_file)], cwd=REPO, capture_output=True, text=True,
                          timeout=300, env=env)


def test_the_workers_share_the_suite_and_report_it_as_one(tmp_path):
    suite = tmp_path / "suite"
    suite.mkdir()
    (suite / "test_a.py").write_text(SUITE)
    (suite / "test_b.py").write_text(SUITE.replace("1 == 2", "2 == 2"))
    logs = tmp_path / "logs"
    # --rootdir: else pytest takes the common ancestor of the suite and of the folder it
    # runs in (the repository), and the tests' names depend on where the clone lies.
    done = subprocess.run([sys.executable, "-m", "tests.gpu_suite", "--workers", "3",
                           "--marker", "", "--no-sanitizer", "--logs", str(logs),
                           f"--rootdir={suite}", str(suite)],
                          cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    assert "FAILED test_a::test_fails" in lines
    assert not any("test_b::test_fails" in line and "FAILED" in line for line in lines)
    assert "make test: 1 failure, 25 passed, 2 skipped, 2 xfailed" in lines[-1]
    # The slowest 20 of the 30, slowest first.
    header = lines.index("slowest tests (s, setup + call + teardown, in a worker beside "
                         "the others):")
    slowest = [float(line.split()[0]) for line in lines[header + 1:header + 1 + 30]
               if re.match(r"\s+\d+\.\d ", line)]
    assert len(slowest) == 20 and slowest == sorted(slowest, reverse=True), lines
    ran = [outcomes([logs / f"worker{i}.xml"]) for i in range(3)]
    assert sum(len(r) for r in ran) == 30  # each test in one worker only
    assert sum(1 for r in ran if r) >= 2  # the sleeping tests spread


def test_a_suite_that_passes_exits_0_and_says_so(tmp_path):
    (tmp_path / "test_c.py").write_text("def test_one():\n    pass\n")
    done = _suite(tmp_path / "test_c.py", tmp_path / "logs")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "make test: 1 passed," in done.stdout.splitlines()[-1]
    # The machine's pace, measured before the workers start: a fresh import of torch.
    (pace,) = re.findall(r"this machine imports torch in a fresh process in (\d+\.\d\d) s",
                         done.stdout)
    assert float(pace) > 0.0


def test_without_a_gpu_or_the_sanitizer_it_says_so_in_one_line(tmp_path):
    import shutil

    import torch
    done = subprocess.run([sys.executable, "-m", "tests.gpu_suite", "--logs", str(tmp_path)],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    if not torch.cuda.is_available():
        assert done.returncode == 2 and done.stderr.strip().splitlines() == [
            "error: make test-gpu needs a CUDA GPU; `make test` runs the CPU suite (the GPU "
            "tests skipped)"]
    done = subprocess.run([sys.executable, "-m", "tests.gpu_suite", "--marker", "",
                           "--logs", str(tmp_path), str(tmp_path)], cwd=REPO,
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PATH": os.path.dirname(sys.executable)})
    if shutil.which("compute-sanitizer", path=os.path.dirname(sys.executable)) is None:
        assert done.returncode == 2, done.stdout + done.stderr
        assert len(done.stderr.strip().splitlines()) == 1
        assert "compute-sanitizer (the CUDA toolkit) is not on PATH" in done.stderr


ALONE = """
import time
import pytest
from tests.helpers import gpu_counters_alone

@pytest.mark.parametrize("i", range(2))
def test_counters(i):
    with gpu_counters_alone():
        start = time.time()
        time.sleep(1.0)
        with open({log!r}, "a") as log:
            log.write(f"{{start}} {{time.time()}}\\n")
"""


def test_the_workers_read_the_gpus_counters_one_at_a_time(tmp_path):
    """ncu's runs and the energy counter's reads (tests.helpers.gpu_counters_alone) never
    overlap across the workers, and the suite's lock file is gone at its end."""
    log = tmp_path / "times.txt"
    (tmp_path / "test_d.py").write_text(ALONE.format(log=str(log)))
    before = set(os.listdir(os.environ.get("TMPDIR", "/tmp")))
    done = _suite(tmp_path / "test_d.py", tmp_path / "logs")
    assert done.returncode == 0, done.stdout + done.stderr
    (a_start, a_end), (b_start, b_end) = sorted(
        tuple(map(float, line.split())) for line in log.read_text().splitlines())
    assert a_end <= b_start, "two workers held the GPU's counters at once"
    ran = [outcomes([tmp_path / "logs" / f"worker{i}.xml"]) for i in range(2)]
    assert all(ran), "the two tests ran in one worker: nothing was shared"
    assert not [n for n in set(os.listdir(os.environ.get("TMPDIR", "/tmp"))) - before
                if n.endswith(".lock")]


MACHINE = """
import time
import pytest

def _log(name):
    start = time.time()
    time.sleep(0.5)
    with open({log!r}, "a") as log:
        log.write(f"{{name}} {{start}} {{time.time()}}\\n")

@pytest.mark.parametrize("i", range(4))
def test_beside(i):
    _log("beside")

@pytest.mark.alone
def test_on_its_own():
    _log("alone")
"""


def test_a_test_marked_alone_runs_after_the_others_in_one_worker(tmp_path):
    """A test that reads the whole machine's state (what is left in /dev/shm) cannot share
    it: it runs once every worker has ended, in a worker of its own."""
    log = tmp_path / "times.txt"
    (tmp_path / "test_e.py").write_text(MACHINE.format(log=str(log)))
    done = _suite(tmp_path / "test_e.py", tmp_path / "logs")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "make test: 5 passed," in done.stdout.splitlines()[-1]
    times = [line.split() for line in log.read_text().splitlines()]
    (alone_start,) = [float(start) for name, start, _ in times if name == "alone"]
    assert alone_start >= max(float(end) for name, _, end in times if name == "beside")
    (ran_alone,) = outcomes([tmp_path / "logs" / "worker-alone.xml"])
    assert ran_alone.endswith("test_e::test_on_its_own")


TOGETHER = """
import os
import time
import pytest

@pytest.mark.parametrize("i", range(6))
def test_spread(i):
    time.sleep(0.3)

@pytest.mark.together("one")
@pytest.mark.parametrize("i", range(4))
def test_grouped(i):
    time.sleep(0.3)
    print("grouped in", os.getpid())

@pytest.mark.together("one")
def test_grouped_too():
    print("grouped in", os.getpid())
"""


def test_tests_marked_together_run_in_one_worker(tmp_path):
    """The workers reach the grouped tests in turn, as they do the others (each sleeps,
    so the other workers are free for one); every one runs in the first worker to reach
    one of them, and each runs once."""
    (tmp_path / "test_g.py").write_text(TOGETHER)
    logs = tmp_path / "logs"
    done = _suite(tmp_path / "test_g.py", logs, workers=3)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "make test: 11 passed," in done.stdout.splitlines()[-1]
    ran = {i: outcomes([logs / f"worker{i}.xml"]) for i in range(3)}
    grouped = [i for i, names in ran.items() if any("grouped" in n for n in names)]
    assert len(grouped) == 1, ran
    assert sum("grouped" in n for n in ran[grouped[0]]) == 5


def test_each_worker_gets_its_share_of_the_cores_for_torchs_threads(tmp_path):
    """Two workers of as many OpenMP threads as cores each, on 2 cores, spun against each
    other: a test of make compare took 330 s instead of 26. Each worker (and what it
    starts) gets cores / workers threads, unless OMP_NUM_THREADS is set; and compiles in
    its own process (Inductor's pools, one a worker, hung a GPU suite), unless
    TORCHINDUCTOR_COMPILE_THREADS is set."""
    log = tmp_path / "threads.txt"
    (tmp_path / "test_f.py").write_text(
        "import os\n\ndef test_threads():\n"
        f"    open({str(log)!r}, 'a').write(os.environ['OMP_NUM_THREADS'] + ' ' + "
        "os.environ['TORCHINDUCTOR_COMPILE_THREADS'] + '\\n')\n")
    ours = ("OMP_NUM_THREADS", "TORCHINDUCTOR_COMPILE_THREADS")
    env = {k: v for k, v in os.environ.items() if k not in ours}
    for workers, given, expected in ((2, None, [str(max(1, os.cpu_count() // 2)), "1"]),
                                     (1, ("3", "4"), ["3", "4"])):
        log.unlink(missing_ok=True)
        done = _suite(tmp_path / "test_f.py", tmp_path / f"logs{workers}", workers,
                      env={**env, **(dict(zip(ours, given)) if given else {})})
        assert done.returncode == 0, done.stdout + done.stderr
        assert log.read_text().split() == expected


def test_a_stopped_suite_names_the_tests_still_running(tmp_path):
    """A suite stopped while a test hangs (a worker's compile on the device waited for 6
    minutes) names that test in its one line, not the tests that ended."""
    started = tmp_path / "started"
    (tmp_path / "test_h.py").write_text(
        "import pathlib\nimport time\n\ndef test_quick():\n    pass\n\n"
        f"def test_waits():\n    pathlib.Path({str(started)!r}).write_text('x')\n"
        "    time.sleep(300)\n")
    proc = subprocess.Popen([sys.executable, "-m", "tests.gpu_suite", "--workers", "2",
                             "--marker", "", "--no-sanitizer", "--logs", str(tmp_path / "logs"),
                             f"--rootdir={tmp_path}", str(tmp_path / "test_h.py")],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    try:
        deadline = time.monotonic() + 120
        while not started.exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started.exists(), "the waiting test never started"
        time.sleep(1)  # test_quick, in the other worker where it went there, has ended
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:  # a failure above: Ctrl-C, and the runner stops its workers
            proc.send_signal(signal.SIGINT)
            proc.communicate(timeout=60)
    assert proc.returncode == 130, out + err
    assert err.strip().splitlines() == [
        f"error: interrupted with 1 test running (test_h::test_waits): every part was "
        f"stopped; logs in {tmp_path / 'logs'}"]


def test_every_test_that_runs_ncu_holds_the_counters_alone():
    """make ncu's GPU test ran its ncu beside the NVTX test's in another worker, and ncu
    exited 9 ("Failed to profile"): a test that starts ncu, or calls one that does, holds
    tests.helpers.gpu_counters_alone around it."""
    import ast
    starts_ncu = ("studies.ncu", "_kernels_under_ncu", "_make_ncu_on_the_gpu")
    bare = []
    for path in sorted((REPO / "tests").rglob("test_*.py")):
        text = path.read_text()
        for node in ast.parse(text).body:
            if not (isinstance(node, ast.FunctionDef) and node.name.startswith("test_")):
                continue
            source = ast.get_source_segment(text, node)
            gpu = any("gpu" in ast.unparse(d) for d in node.decorator_list)
            if gpu and any(s in source for s in starts_ncu) and \
                    "gpu_counters_alone" not in source:
                bare.append(f"{path.relative_to(REPO)}::{node.name}")
    assert not bare, bare
