"""TensorBoard's profiler plugin on our traces, through its data endpoints, from a server
the test starts on a free loopback port (viewer/serve.py, as make
tensorboard runs it). GPU: the real H100 fixtures; CPU: a trace made here."""

import gzip
import json
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

import train
from tests.helpers import FIXTURES, REPO
from viewer.tb_profiler_compat import OFFLINE_CHARTS_NOTE

pytest.importorskip("torch_tb_profiler")
PLUGIN = "/data/plugin/pytorch_profiler"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(base: str, path: str):
    with urllib.request.urlopen(base + PLUGIN + path, timeout=60) as response:
        assert response.status == 200, path
        body = response.read()
        if response.headers.get("Content-Encoding") == "gzip":
            body = gzip.decompress(body)
        return json.loads(body)


@pytest.fixture(scope="module")
def logdir(tmp_path_factory):
    """Three real H100 traces and a two-H200 DDP run's two (fixtures), and a CPU run made
    here, one folder each."""
    logdir = tmp_path_factory.mktemp("logdir")
    for name in ("kernel", "padded", "graph"):
        run = logdir / f"gpu_{name}"
        run.mkdir()
        shutil.copy(FIXTURES / f"gpu_{name}_train.pt.trace.json.gz",
                    run / "train.1.pt.trace.json.gz")
    (logdir / "gpu_ddp").mkdir()
    for rank in (0, 1):
        shutil.copy(FIXTURES / f"gpu_ddp_rank{rank}.pt.trace.json.gz",
                    logdir / "gpu_ddp" / f"rank{rank}.1.pt.trace.json.gz")
    train.run(train.parse_config(["--preset", "cpu", "--batch-size", "4", "--image-size",
                                  "32", "--hidden", "32", "--num-workers", "0", "--wait",
                                  "0", "--warmup", "1", "--active", "2", "--run-name",
                                  "cpu_padded", "--out-dir", str(logdir)]))
    return logdir


SERVER = {}  # the server fixture's process


@pytest.fixture(scope="module")
def server(logdir):
    port = _free_port()
    log = open(logdir / "tensorboard.log", "w")
    proc = subprocess.Popen([sys.executable, "-m", "viewer.serve", "--logdir",
                             str(logdir), "--port", str(port)], cwd=REPO, stdout=log,
                            stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    SERVER["proc"] = proc
    try:
        deadline = time.time() + 180
        while True:
            try:
                runs = _get(base, "/runs")
                if not runs["loading"] and len(runs["runs"]) == 5:  # 4 fixtures + the CPU run
                    break
            except OSError:
                pass
            assert proc.poll() is None, (logdir / "tensorboard.log").read_text()[-3000:]
            assert time.time() < deadline, "TensorBoard did not load the runs in 180 s"
            time.sleep(1)
        yield base
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()


def test_the_address_comes_first_not_under_the_plugins_lines(server, logdir):
    """make tensorboard printed its URL as line 44 of 46, under the profiler plugin's
    INFO lines, one a trace it loaded."""
    lines = (logdir / "tensorboard.log").read_text().splitlines()
    assert lines[0] == f"make tensorboard: open {server}/#pytorch_profiler (Ctrl-C stops it)"
    assert not any(" INFO " in line for line in lines), lines[:12]


def _q(run: str) -> str:
    return f"run={run}&worker=train&span=1"


def _ops(base, run):
    return {row["name"]: row for row in
            _get(base, f"/operation/table?{_q(run)}&group_by=Operation")["data"]}


@pytest.mark.parametrize("run", ("gpu_kernel", "gpu_padded"))
def test_gpu_operators_have_device_time(server, run):
    ops = _ops(server, run)
    for name in ("aten::mm", "aten::addmm", "aten::cudnn_convolution"):
        assert ops[name]["device_self_duration"] > 0, name
    assert ops["aten::convolution"]["device_total_duration"] > 0


def test_gpu_kernels_are_attributed_to_their_op(server):
    rows = _get(server, f"/kernel/table?{_q('gpu_kernel')}&group_by=OpName,Kernel")["data"]["rows"]
    giou = {row[0]: row[1] for row in rows if "giou" in row[0]}
    assert set(giou) == {"_giou_fwd_kernel", "_giou_finalize_kernel", "_giou_bwd_kernel"}
    for kernel, op in giou.items():
        assert "triton_loss" in op, (kernel, op)  # not "CallTreeRoot"
    assert not any(row[1] == "CallTreeRoot" for row in rows)
    ops = _ops(server, "gpu_kernel")
    assert ops["giou::triton_loss"]["device_total_duration"] > 0
    assert ops["giou::triton_loss_backward"]["device_self_duration"] > 0


def test_gpu_overview_counts_runtime_and_steps(server):
    overview = _get(server, f"/overview?{_q('gpu_kernel')}")
    parts = {p["name"]: p["value"] for p in overview["performance"][0]["children"]}
    assert parts["Kernel"] > 0 and parts["Runtime"] > 0
    steps = [row[0] for row in overview["steps"]["rows"]]
    assert steps == ["2", "3"]  # the two profiled steps, no GPU-side twin


@pytest.mark.parametrize("run", ("gpu_kernel", "cpu_padded"))
def test_memory_and_trace_views_answer(server, run):
    assert run in _get(server, "/runs")["runs"]
    views = _get(server, f"/views?run={run}")
    for view in ("Overview", "Operator", "Trace", "Memory"):
        assert view in views
    memory = _get(server, f"/memory?{_q(run)}")
    assert memory["rows"], "no memory rows"


@pytest.mark.parametrize("run", ("gpu_kernel", "cpu_padded"))
def test_trace_view_serves_the_events(server, run):
    events = _get(server, f"/trace?{_q(run)}")["traceEvents"]
    names = {e.get("name") for e in events}
    assert {"copy", "forward", "loss", "loss_backward"} <= names
    if run.startswith("gpu"):
        assert "_giou_fwd_kernel" in names


def test_a_cuda_graph_runs_views_open_with_the_replays_kernels(server):
    """A replayed step: one range ('graph') and one launch; the views still answer and the
    graph's kernels are there (recorded on the H100 by bench/record_fixtures.sh)."""
    overview = _get(server, f"/overview?{_q('gpu_graph')}")
    parts = {p["name"]: p["value"] for p in overview["performance"][0]["children"]}
    assert parts["Kernel"] > 0
    rows = _get(server, f"/kernel/table?{_q('gpu_graph')}&group_by=Kernel")["data"]["rows"]
    names = {row[0] for row in rows}
    assert "_first_block_fwd_kernel" in names and "_shadow_sgd_kernel" in names
    events = _get(server, f"/trace?{_q('gpu_graph')}")["traceEvents"]
    assert "graph" in {e.get("name") for e in events}
    assert "cudaGraphLaunch" in {e.get("name") for e in events}


def _distributed(base, path):
    return _get(base, f"/distributed/{path}?run=gpu_ddp&worker=All&span=1")["data"]


def _host_collectives_us(rank: int) -> float:
    """Per profiled step, the host time of rank's collective ops (nccl:all_reduce ranges),
    which the plugin counts as communication besides the NCCL kernels."""
    from profiling.trace_events import host_ranges, load_trace
    events = load_trace(FIXTURES / f"gpu_ddp_rank{rank}.pt.trace.json.gz")
    _, steps = host_ranges(events, ())
    inside = sum(float(e["dur"]) for e in events if e.get("cat") == "user_annotation"
                 and e.get("name") == "nccl:all_reduce"
                 and any(s <= float(e["ts"]) <= t for s, t, _ in steps))
    return inside / len(steps)


def test_the_distributed_view_of_a_two_gpu_run(server):
    """Both ranks listed, NCCL time tied to the collectives, and the view's split of it
    against ours (summary.json of the same run, profiling/communication.py): the plugin
    also counts the host ranges of the collective ops as communication."""
    assert "Distributed" in _get(server, "/views?run=gpu_ddp")
    ours = json.loads((FIXTURES / "gpu_ddp_train.summary.json").read_text())
    overlap = _distributed(server, "overlap")["all"]
    assert sorted(overlap) == ["rank0", "rank1"]
    for rank, name in enumerate(("rank0", "rank1")):
        compute_only, overlapped, comm_only, _other = overlap[name]
        comm = ours["distributed"]["ranks"][rank]["communication"]
        comm_us, ours_overlapped_us = comm["comm_ms"] * 1e3, comm["overlapped_ms"] * 1e3
        assert comm_us > 0 and compute_only > 0
        plugin_comm = overlapped + comm_only
        assert comm_us * 0.95 <= plugin_comm <= (comm_us + _host_collectives_us(rank)) * 1.05, \
            (name, plugin_comm, comm_us)
        assert abs(overlapped - ours_overlapped_us) <= 0.05 * comm_us + 25, (name, overlapped)
    ops = _distributed(server, "commops")
    for name in ("rank0", "rank1"):
        (row,) = ops[name]["rows"]
        # 4 a step (the box counts, the loss sums, lin1's bucket, the rest), 2 profiled steps
        assert row[0] == "nccl:all_reduce" and row[1] == 8
        assert row[4] > 0  # its total latency
    gpus = _distributed(server, "gpuinfo")
    assert sorted(gpus) == ["rank0", "rank1"]
    assert "NVIDIA H200" in json.dumps(gpus)


def test_the_page_says_why_charts_are_missing_offline(server):
    """The page is served with the offline stand-in right after the Charts loader."""
    with urllib.request.urlopen(server + PLUGIN + "/index.html", timeout=60) as response:
        page = response.read().decode()
    loader = page.index("charts/loader.js")
    assert loader < page.index("offline-charts-note") < page.index('<div id="app">')
    assert OFFLINE_CHARTS_NOTE.split(":")[0] in page


def test_scalars_of_a_run(logdir):
    """The Scalars tab: loss, step time and every phase's CPU time of the run; its GPU
    time only where a GPU measured it (a CPU run wrote phase_gpu_ms = 0.0, which read as
    a measured zero)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    tags = set(EventAccumulator(str(logdir / "cpu_padded")).Reload().Tags()["scalars"])
    assert {"loss", "step_time_ms", "phase_cpu_ms/loss",
            "phase_cpu_ms/loss_backward", "phase_cpu_ms/optimizer"} <= tags
    assert not any(tag.startswith("phase_gpu_ms/") for tag in tags), tags


def _zombie_children(pid: int) -> list[int]:
    """The children of pid that have ended but were never waited for (Linux /proc)."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if fields[0] == "Z" and int(fields[1]) == pid:
            found.append(int(stat.parent.name))
    return found


def test_the_runs_loader_processes_are_reaped(server):
    """The plugin forks a process per trace it loads and never waits for the last ones:
    a TensorBoard left running kept them as zombies (17 after ~30 runs)."""
    pid = SERVER["proc"].pid
    deadline = time.time() + 15
    while _zombie_children(pid) and time.time() < deadline:
        time.sleep(0.5)
    assert not _zombie_children(pid)


def test_cpu_trace_still_works(server):
    overview = _get(server, f"/overview?{_q('cpu_padded')}")
    assert overview["performance"][0]["value"] > 0
    ops = _ops(server, "cpu_padded")
    assert ops["aten::addmm"]["host_self_duration"] > 0


def test_the_unpatched_plugin_shows_the_bug_this_fixes():
    """Plain torch-tb-profiler 0.4.3 on the same GPU trace: zero device time. If a later
    plugin release passes this, viewer/tb_profiler_compat.py can go."""
    code = """
import sys
from torch_tb_profiler.profiler.data import RunProfileData
from torch_tb_profiler.profiler.run_generator import RunGenerator
data = RunProfileData.parse("train", "1", sys.argv[1], sys.argv[2])
data.process(); data.analyze()
profile = RunGenerator("train", "1", data).generate_run_profile()
ops = {r["name"]: r for r in profile.operation_table_by_name["data"]}
print(ops["aten::mm"]["device_self_duration"])
"""
    trace = FIXTURES / "gpu_kernel_train.pt.trace.json.gz"
    out = subprocess.run([sys.executable, "-c", code, str(trace), "/tmp"], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert float(out.stdout.strip().splitlines()[-1]) == 0


def test_the_unpatched_plugin_ties_no_nccl_kernel_to_its_collective():
    """Plain 0.4.3 on a rank of the two-GPU run: each collective holds only its own host
    range (no kernel), and the NCCL kernels count as computation."""
    code = """
import sys
from torch_tb_profiler.profiler.data import RunProfileData
data = RunProfileData.parse("rank0", "1", sys.argv[1], "/tmp")
data.process(); data.analyze()
print(max(len(n.kernel_ranges) for n in data.comm_node_list))
"""
    trace = FIXTURES / "gpu_ddp_rank0.pt.trace.json.gz"
    out = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True,
                         text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.strip().splitlines()[-1] == "1"


def _wait_for_text(drv, text, timeout=60):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait
    WebDriverWait(drv, timeout).until(
        lambda d: text in d.find_element(By.TAG_NAME, "body").text)


def _choose(drv, label: str, option: str, expected: set[str]) -> list[str]:
    """Open the sidebar dropdown under `label` (Runs, Views, Workers), wait until it lists
    every expected option by its text (an opening list has items whose text is still
    empty), pick `option`, wait for the list to close, and return what it listed."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    def listed(d):
        try:
            texts = [item.text for item in d.find_elements(By.CSS_SELECTOR, "li[role=option]")]
        except StaleElementReferenceException:  # the list re-rendered while being read
            return False
        return texts if expected <= set(texts) else False

    heading = drv.find_element(By.XPATH, f"//*[normalize-space(text())='{label}']")
    heading.find_element(By.XPATH, "following::div[@aria-haspopup='listbox'][1]").click()
    texts = WebDriverWait(drv, 60).until(listed, f"{label} never listed {sorted(expected)}")
    WebDriverWait(drv, 30).until(lambda d: d.find_element(
        By.XPATH, f"//li[@role='option'][normalize-space(.)='{option}']")).click()
    WebDriverWait(drv, 30).until_not(lambda d: d.find_elements(By.CSS_SELECTOR, "li[role=option]"))
    return texts


@pytest.mark.browser
def test_profiler_page_in_chromium(server, browser, tmp_path):
    """Opens the profiler page as a person would (offline: the banner says why the charts
    are missing), picks the GPU run, waits for its Overview, lists the views, switches to
    Operator, and keeps screenshots of both."""
    import os

    from selenium.webdriver.common.by import By
    shots = Path(os.environ.get("SCREENSHOT_DIR", tmp_path))
    shots.mkdir(parents=True, exist_ok=True)
    browser.get(server + PLUGIN + "/index.html")
    _wait_for_text(browser, "Configuration")  # the first run's Overview has rendered
    _wait_for_text(browser, OFFLINE_CHARTS_NOTE)  # this machine cannot fetch Google Charts
    runs = _choose(browser, "Runs", "gpu_kernel", {"cpu_padded", "gpu_kernel", "gpu_padded"})
    assert "" not in runs, runs
    _wait_for_text(browser, "NVIDIA H100 80GB HBM3")  # the GPU run's Overview
    _wait_for_text(browser, "Performance Recommendation")
    browser.save_screenshot(str(shots / "tensorboard-overview.png"))

    views = _choose(browser, "Views", "Operator",
                    {"Overview", "Operator", "GPU Kernel", "Trace", "Memory"})
    assert "" not in views, views
    _wait_for_text(browser, "aten::addmm")
    table = browser.find_element(By.XPATH, "//*[normalize-space(text())='Group By']")
    browser.execute_script("arguments[0].scrollIntoView(true);", table)
    browser.save_screenshot(str(shots / "tensorboard-operator.png"))
    assert "aten::cudnn_convolution" in browser.find_element(By.TAG_NAME, "body").text

    # The two-H200 DDP run: its Distributed view lists both ranks' GPUs and collectives.
    _choose(browser, "Runs", "gpu_ddp", {"gpu_ddp", "gpu_kernel"})
    _choose(browser, "Views", "Distributed", {"Overview", "Distributed"})
    # Offline its charts and the collectives' table (Google Charts) stay empty; their
    # figures are checked through the endpoints (test_the_distributed_view_of_...).
    for text in ("Device Information", "rank1", "NVIDIA H200",
                 "Computation/Communication Overview", "Synchronizing/Communication Overview"):
        _wait_for_text(browser, text)
    browser.save_screenshot(str(shots / "tensorboard-distributed.png"))


def test_a_logdir_that_does_not_exist_is_one_line(tmp_path, capsys):
    """TensorBoard served an empty page for it, silently (make tensorboard LOGDIR=...)."""
    from viewer import serve
    missing = tmp_path / "nonexistent"
    for args in (["--logdir", str(missing)], [f"--logdir={missing}"]):
        assert serve.main([*args, "--port", "0"]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert err == [f"error: no folder {missing}: make profile writes its runs into "
                       "profiles/ (LOGDIR= picks another folder)"]


@pytest.mark.parametrize("name,content,why", [
    ("host.pt.trace.json", b"", "it is empty"),
    ("host.pt.trace.json", b'{"traceEvents": [{"ph": "X"', "not a JSON object"),
    ("host.pt.trace.json", b"[1, 2]", "not a JSON object"),
    ("host.pt.trace.json.gz", b"\x1f\x8b\x08\x00garbage", "not a whole gzip file"),
    ("host.pt.trace.json.gz", b"plain text, not gzip", "not a whole gzip file"),
    ("host.pt.trace.json", b"\x80\xff\x00\x01", "not a JSON object"),
])
def test_a_bad_trace_is_one_line_naming_it(tmp_path, capsys, name, content, why):
    """A truncated, empty, binary or wrongly typed trace: the plugin's forked loader
    printed its traceback among the server's lines; now one line before it starts."""
    import gzip

    from viewer import serve
    good = tmp_path / "good" / "plugins" / "profile"
    good.mkdir(parents=True)
    (good / "ok.pt.trace.json.gz").write_bytes(gzip.compress(b'{"traceEvents": []}\n'))
    bad = tmp_path / "bad" / name
    bad.parent.mkdir()
    bad.write_bytes(content)
    assert serve.main(["--logdir", str(tmp_path), "--port", "0"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {bad}: {why}"), err
    bad.unlink()
    assert serve.trace_fault(good / "ok.pt.trace.json.gz") is None


@pytest.mark.parametrize("port", ["abc", "70000", "-1"])
def test_a_port_that_is_not_one_is_one_line(tmp_path, capsys, port):
    """make tensorboard PORT=abc printed TensorBoard's usage, 20 lines."""
    from viewer import serve
    for args in (["--port", port], [f"--port={port}"]):
        assert serve.main(["--logdir", str(tmp_path), *args]) == 2
        assert capsys.readouterr().err.strip().splitlines() == [
            f"error: port {port!r} is not a port number: give 0..65535, 0 for any free one "
            "(make tensorboard PORT=6006)"]


@pytest.mark.parametrize("signum", ["SIGINT", "SIGTERM"])
def test_a_signal_while_traces_load_ends_the_server_and_its_children(tmp_path, signum):
    """Ctrl-C (or SIGTERM) to make tensorboard's group while the plugin loads traces: the
    server and every process it forked end within seconds, with one line and no
    traceback. The plugin's Manager and trace loaders used to take the signal too: 44
    tracebacks, and some ran on a minute after the prompt came back."""
    import signal
    for copy in range(4):
        for name in ("kernel", "padded", "graph"):
            run = tmp_path / f"gpu_{name}_{copy}"
            run.mkdir()
            shutil.copy(FIXTURES / f"gpu_{name}_train.pt.trace.json.gz",
                        run / "train.1.pt.trace.json.gz")
    # The plugin's INFO lines, which make tensorboard hides unless asked: the user's
    # TORCH_PROFILER_LOG_LEVEL wins, and its "Add run" line says loading has begun.
    env = dict(os.environ, TORCH_PROFILER_LOG_LEVEL="INFO")
    proc = subprocess.Popen([sys.executable, "-m", "viewer.serve", "--logdir", str(tmp_path),
                             "--port", str(_free_port())], cwd=REPO, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True, env=env)
    began = time.time() + 120
    for line in proc.stderr:
        if "plugin.py" in line and "Add run" in line:  # loading has begun
            break
        assert time.time() < began, "no 'Add run' line from the plugin in 120 s"
    os.killpg(proc.pid, getattr(signal, signum))
    sent = time.time()
    _, err = proc.communicate(timeout=60)
    assert time.time() - sent < 5, "the server outlived the signal"
    assert proc.returncode == 130 and "make tensorboard: stopped" in err, err[-2000:]
    assert "Traceback" not in err, err[-3000:]
    deadline = time.time() + 5
    while _group_members(proc.pid) and time.time() < deadline:
        time.sleep(0.1)
    assert not _group_members(proc.pid), "a child of the server outlived it"


def _group_members(group: int) -> list[int]:
    members = []
    for pid in os.listdir("/proc"):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if pid.isdigit() and int(stat.rsplit(")", 1)[1].split()[2]) == group:
            members.append(int(pid))
    return members


def test_a_signal_in_a_child_forked_before_its_hook_ends_the_child_alone():
    """The signal to the group can reach a loader forked that instant, before its fork hook
    ignores it (threading's hooks run first), and the child then runs the server's
    handler: a CI run saw it join the server's children and print a traceback. The child
    goes at once, silently; the server's children are the server's to end."""
    script = """
import multiprocessing, os, signal, sys, time
from viewer import serve
serve._SERVER.append(os.getpid())
signal.signal(signal.SIGTERM, serve._stop)
sibling = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
sibling.start()                      # a child of the server's, which the child must not join
child = os.fork()
if child == 0:                       # the handler inherited, as in the window before the hook
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(5)
    os._exit(3)                      # the signal was lost
_, status = os.waitpid(child, 0)
print("child exit", os.waitstatus_to_exitcode(status), "sibling alive", sibling.is_alive())
sibling.kill()
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "child exit 0 sibling alive True", done.stdout + done.stderr
    assert done.stderr == "", done.stderr
