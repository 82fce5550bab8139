import getpass
import multiprocessing.util
import os
import shutil
import tempfile
import time
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton's interpreter runs the kernels on CPU tensors. It must be chosen
# before triton is imported, so it is set here, before any test module loads.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_finish(session):
    """What the tests' imports made is frozen out of the collector's walk, as a program's
    is (core/gc_pause.imports_done): torch and the torch._dynamo that each in-process
    run's optimizer imports are some 370,000 objects that live as long as the worker, and
    every full collection walked them all (one a model build in model/build.py, one a
    point in make sweep's collate timer). Collected first, so no garbage is frozen."""
    import gc

    import torch._dynamo  # noqa: F401
    gc.collect()
    gc.freeze()


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (make test-gpu on the device)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# A test's random inputs can be drawn again: TEST_TORCH_SEED=<n> seeds every test with n
# (tests/cases.py's loss cases have fixed seeds of their own, which TEST_SEED shifts).
SEED_ENV = "TEST_TORCH_SEED"


@pytest.fixture(autouse=True)
def a_fresh_seed_named_on_failure(request):
    """Every test: torch's generators seeded afresh, so each run draws new inputs (torch's
    own first seed is a constant, so a worker's first draws were the same every run), and
    the seed is kept for pytest_runtest_makereport to print beside a failure."""
    seed = int(os.environ.get(SEED_ENV) or int.from_bytes(os.urandom(4), "little") >> 1)
    torch.manual_seed(seed)
    request.node.torch_seed = seed
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    seed = getattr(item, "torch_seed", None)
    if report.failed and seed is not None:
        report.sections.append(("torch seed", f"{SEED_ENV}={seed} pytest '{item.nodeid}' "
                                              "draws this test's inputs again"))


@pytest.fixture(autouse=True)
def cudnn_flags_as_they_were():
    """Every test: cuDNN's process-wide flags as the test found them. A run sets
    torch.backends.cudnn.benchmark for its speed-ups (training/speedups/
    cudnn_benchmark.py), and autotuning picks other algorithms (TF32 ones for fp32
    among them) for every convolution after it: no test's result may depend on which
    tests ran before it in its process (make test-gpu spreads them over several)."""
    cudnn = torch.backends.cudnn
    before = (cudnn.benchmark, cudnn.allow_tf32, cudnn.deterministic)
    yield
    cudnn.benchmark, cudnn.allow_tf32, cudnn.deterministic = before


@pytest.fixture(autouse=True)
def a_fresh_compiler_for_compiled_packed(request):
    """Each test of the compiled_packed strategy from a fresh Dynamo: the tests change
    dtypes, index types and sizes of 0 and 1, each a graph of its own, and one process of
    them passed Dynamo's recompile limit (8 a function), past which fullgraph raises. A
    run has one dtype and one index type (losses/compiled_packed.py)."""
    params = getattr(getattr(request.node, "callspec", None), "params", {})
    if "compiled_packed" in params.values():
        torch._dynamo.reset()
    yield


@pytest.fixture(autouse=True)
def gpu_memory_given_back():
    """Every test on a GPU: the memory it freed goes back to the device, not to this
    process's cache. make test-gpu runs several pytest processes on one GPU; in its first
    run with six, beside a seventh process, three fp32 conv-pool tests failed at their
    kernel's first launch with 'Triton Error [CUDA]: out of memory' (the driver finds
    room for a kernel's local memory then, and the fp32 IEEE kernels spill), while the
    other processes held cached blocks. No gc pass after each: the one run with it went
    slower (results/correctness.md)."""
    yield
    if torch.cuda.is_initialized():
        torch.cuda.empty_cache()


@pytest.fixture(autouse=True)
def no_plain_trace_is_left(request):
    """Every test: no run folder it made may be left with a plain (not gzipped) trace."""
    tmp = request.getfixturevalue("tmp_path") if "tmp_path" in request.fixturenames else None
    yield
    if tmp is not None:
        plain = sorted(str(p) for p in tmp.rglob("*.pt.trace.json"))
        assert not plain, f"plain traces left behind: {plain}"


# -- nothing left behind ----------------------------------------------------------------
# Every process the tests start gets this session's own TMPDIR, so that after each test
# what it left is plain to see and no other session's files are mistaken for it: a
# process still running (found by that TMPDIR in its environment, even once orphaned),
# or a temporary folder (multiprocessing's pymp-*, torchrun's torchelastic_*, the
# launcher's ragged-ranks-*). pytest's own tmp_path folders and Inductor's cache stay
# where they were.
_REAL_TMP = tempfile.gettempdir()
os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", _REAL_TMP)
os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR",
                      os.path.join(_REAL_TMP, f"torchinductor_{getpass.getuser()}"))
SESSION_TMP = Path(tempfile.mkdtemp(prefix="ragged-tests-", dir=_REAL_TMP))
# Removed as this process ends, after the multiprocessing folder (pymp-*) this process may
# make in it (a loader's workers share it: data/loader.py), whose finalizer runs at
# priority -100, higher first: removed before it, that finalizer printed a traceback.
multiprocessing.util.Finalize(None, shutil.rmtree, args=(str(SESSION_TMP), True),
                              exitpriority=-200)
os.environ["TMPDIR"] = str(SESSION_TMP)
tempfile.tempdir = str(SESSION_TMP)
# Processes that may outlive a test: Inductor's pool of compile workers (torch.compile in
# this process starts it once and keeps it), multiprocessing's resource tracker (one per
# process that shares memory or semaphores, this one's for the session).
LONG_LIVED = ("compile_worker", "multiprocessing.resource_tracker")
# Folders that are caches, not litter: some of Inductor's ignore TORCHINDUCTOR_CACHE_DIR
# and go under the temporary folder (torch._inductor.runtime.cache_dir_utils).
CACHES = ("torchinductor_",)


def _session_processes() -> dict[int, str]:
    """pid -> command line of each live process with this session's TMPDIR, but this
    one."""
    marker = f"TMPDIR={SESSION_TMP}".encode()
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker not in (entry / "environ").read_bytes().split(b"\0"):
                continue
            cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(
                errors="replace").strip()
        except OSError:
            continue
        if cmdline and not any(name in cmdline for name in LONG_LIVED):
            found[int(entry.name)] = cmdline
    return found


def _temp_folders() -> set[str]:
    own = multiprocessing.process.current_process()._config.get("tempdir")
    return {p.name for p in SESSION_TMP.iterdir()
            if str(p) != own and not p.name.startswith(CACHES)}


@pytest.fixture(autouse=True)
def nothing_is_left_behind():
    """Every test: no process it started still runs, and no temporary folder it made is
    left, within a grace period (workers see their parent gone and exit)."""
    processes, folders = set(_session_processes()), _temp_folders()
    yield
    deadline = time.time() + 20
    while True:
        running = {p: c for p, c in _session_processes().items() if p not in processes}
        left = _temp_folders() - folders
        if not (running or left) or time.time() > deadline:
            break
        time.sleep(0.25)
    for path in left:  # the next test must not fail for this one
        shutil.rmtree(SESSION_TMP / path, ignore_errors=True)
    assert not running, f"processes left running: {running}"
    assert not left, f"temporary folders left in {SESSION_TMP}: {sorted(left)}"


CHROMIUM_FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync", "--window-size=1500,1100")


@pytest.fixture
def browser(tmp_path):
    """Headless Chromium through selenium (make test-browser)."""
    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        # make test-browser installs them and sets REQUIRE_BROWSER: there a missing
        # browser is a failure, never a skip that passes on nothing.
        if os.environ.get("REQUIRE_BROWSER"):
            pytest.fail("chromium and chromedriver are not installed")
        pytest.skip("needs Debian's chromium and chromium-driver: make test-browser")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in CHROMIUM_FLAGS + (f"--user-data-dir={tmp_path / 'chromium'}",):
        options.add_argument(flag)
    drv = webdriver.Chrome(service=Service(driver), options=options)
    try:
        yield drv
    finally:
        drv.quit()
