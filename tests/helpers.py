"""What several test files share: the repository's path, the tiny and small run sizes,
and how a command's output is read."""

import contextlib
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from core.names import COMPILED

REPO = Path(__file__).resolve().parent.parent
# Traces and summaries recorded on the GPU (bench/record_fixtures.sh).
FIXTURES = REPO / "tests" / "fixtures"
# A train.py run that takes seconds on 2 CPU cores.
TINY = ["--preset", "cpu", "--batch-size", "4", "--image-size", "32", "--hidden", "32",
        "--num-workers", "0", "--wait", "0", "--warmup", "1", "--active", "2"]
# A short GPU run (make test-gpu).
SMALL = ["--preset", "gpu", "--batch-size", "64", "--image-size", "64", "--hidden", "256",
         "--num-workers", "2", "--wait", "1", "--warmup", "1", "--active", "2",
         "--no-compile"]
# The tests that compile with Inductor on the CPU, in one worker of make test
# (tests/claims.py): each process pays the compiler's set-up (its imports, the vector ISA's
# probes, the precompiled header) and traces each graph anew; one process pays once.
# results/correctness.md has the CPU seconds, in one worker and in three.
ONE_CPU_COMPILER = pytest.mark.together("inductor-cpu")


def compiler_marks(strategy: str) -> tuple:
    """A CPU test's marks for a strategy: one compiler for the compiled ones."""
    return (ONE_CPU_COMPILER,) if strategy in COMPILED else ()


def our_lines(stderr: str) -> list[str]:
    """stderr without libkineto's 'USDT:' markers (torch 2.13's CPU build prints them on
    every profile unless KINETO_LOG_LEVEL is above 5: profiling/trace_events.py's
    quiet_cpu_profiler sets it, but a user's or CI's own value wins)."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("USDT:")]


def cli(*args, cwd=REPO, timeout=300):
    """train.py at the TINY size in a process of its own."""
    return subprocess.run([sys.executable, str(REPO / "train.py"), *TINY, *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


def one_line_and_nothing_written(result, out: Path, message: str, code: int = 2):
    lines = our_lines(result.stderr)
    assert result.returncode == code, result.stderr[-2000:]
    assert len(lines) == 1 and message in lines[0], result.stderr[-2000:]
    assert not out.exists() or not list(out.iterdir()), sorted(out.rglob("*"))


def make_every_loss_nan(monkeypatch) -> None:
    """Every strategy that losses.get gives from now on returns a NaN loss."""
    import dataclasses

    import losses
    real_get = losses.get

    def get(*args, **kwargs):
        strategy = real_get(*args, **kwargs)
        return dataclasses.replace(strategy, loss=lambda p, t: strategy.loss(p, t) * float("nan"))
    monkeypatch.setattr(losses, "get", get)


LONG = [a if a != "2" else "400" for a in TINY]  # 400 profiled steps: time to interrupt


def start_long_run(out: Path, *args):
    """train.py at the TINY size with 400 profiled steps, in a process of its own that
    takes Ctrl-C as a terminal gives it; its run folder is out/run."""
    return subprocess.Popen([sys.executable, "-u", str(REPO / "train.py"), *LONG,
                             "--out-dir", str(out), "--run-name", "run", *args], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_ctrl_c_as_a_terminal_gives_it,
                            start_new_session=True)  # its own process group, as a job


def _ctrl_c_as_a_terminal_gives_it():
    """A suite started in the background (`make test &`) inherits SIGINT ignored, and a
    Python started with it ignored leaves it so: the Ctrl-C tests would pass for nothing
    or fail. The child gets the default, as in a terminal."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def signal_after(proc, line_part: str, signum, timeout=300, group=False, again=None,
                 delay=0.0):
    """Sends signum `delay` seconds after stdout shows line_part (group: to the process's
    whole group, as a terminal or `timeout` does; again: seconds after which it is sent a
    second time); returns (exit code, stderr lines); proc.rest_of_stdout holds what it
    printed after."""
    import os
    send = (lambda: os.killpg(proc.pid, signum)) if group else (lambda: proc.send_signal(signum))
    deadline = time.time() + timeout
    for line in proc.stdout:
        if line_part in line:
            time.sleep(delay)
            send()
            if again is not None:
                time.sleep(again)
                send()
            break
        assert time.time() < deadline, f"no {line_part!r} in {timeout} s"
    proc.rest_of_stdout, err = proc.communicate(timeout=timeout)
    return proc.returncode, our_lines(err)


def gone(text: str, seconds: float = 15) -> bool:
    """No process mentions text, within seconds (workers see their parent gone and exit)."""
    deadline = time.time() + seconds
    while processes_mentioning(text) and time.time() < deadline:
        time.sleep(0.2)
    return not processes_mentioning(text)


def processes_mentioning(text: str) -> list[int]:
    """The pids whose command line holds text (Linux /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if text in (entry / "cmdline").read_bytes().decode(errors="replace"):
                    found.append(int(entry.name))
            except OSError:
                continue
    return found


def backward_into_nan_memory(loss, pred, monkeypatch) -> None:
    """loss.backward() with every fresh float allocation holding NaN, so a kernel that
    skips a gradient row shows it: torch.empty is patched for the Triton ops (Python),
    and for the CUDA ops a NaN block of the gradient's size is freed just before, which
    CUDA's caching allocator hands back to the op's at::empty."""
    import torch
    real_empty = torch.empty

    def poisoned(*args, **kwargs):
        t = real_empty(*args, **kwargs)
        return t.fill_(float("nan")) if t.is_floating_point() else t
    monkeypatch.setattr(torch, "empty", poisoned)
    if pred.is_cuda:
        torch.full(pred.shape, float("nan"), dtype=pred.dtype, device=pred.device)  # freed
    loss.backward()
    monkeypatch.undo()


def floats_of_bits(bits: list[int]):
    """fp32 values with these bit patterns (each an unsigned 32-bit int): the edge cases of
    a rounding, written as bits."""
    import torch
    b = torch.tensor(bits, dtype=torch.int64)
    return torch.where(b >= 1 << 31, b - (1 << 32), b).to(torch.int32).view(torch.float32)


def kernels_launched(fn) -> list[str]:
    """The CUDA kernels fn launches, by name."""
    import torch
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()  # host-device sync: the kernels are recorded when done
    return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]


@contextlib.contextmanager
def nearly_full_disk(folder: Path, free_kb: int = 60):
    """A 2 MB tmpfs mounted at folder with free_kb left: a real full disk, for a test to
    write into. Skips the test where mounting is not allowed (not root, no
    CAP_SYS_ADMIN in a container)."""
    import pytest
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(folder)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        (folder / "filler").write_bytes(b"\0" * (2048 - free_kb) * 1024)
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=True)


def interrupt_at_run(monkeypatch, study, n: int, message: str = "") -> list:
    """The study module's n-th run (its `attempt`) raises KeyboardInterrupt(message), as
    Ctrl-C ("") or SIGTERM ("SIGTERM") would there; the runs before it are made. Returns
    the list of the attempts' tags, which a test may reset to count again."""
    real, calls = study.attempt, []

    def attempt(cfg, tag):
        calls.append(tag)
        if len(calls) == n:
            raise KeyboardInterrupt(message)
        return real(cfg, tag)

    monkeypatch.setattr(study, "attempt", attempt)
    return calls


def model_with(names, image_size: int, capacity: int, hidden: int, seed: int,
               device="cpu", dtype=None, lr: float = 0.1):
    """(model, optimizer) as a run builds them, with only the named speed-ups on
    (training/speedups/), not compiled; dtype: the one autocast gives the convolutions
    (fp32 by default)."""
    import torch

    from model import build_model
    from training import speedups
    from training.speedups.base import Build
    used = {name: name in names for name in speedups.ORDER}
    build = Build(dtype or torch.float32, lr)
    model, _ = build_model(image_size, capacity, hidden, False, seed, torch.device(device),
                           transform=speedups.model_transform(used, build))
    return model, speedups.make_optimizer(model, used, build)


def shadow_steps(names, seed: int, device="cpu", steps: int = 3, batch: int = 6):
    """(losses, model, optimizer) after `steps` train steps of an uncompiled model with the
    named speed-ups (lin1's shadow and what builds on it), bf16 autocast, padded's loss, a
    new batch each step; lin1's update beside the trunk joined at the end (what reads lin1
    between steps joins first)."""
    import torch

    import losses
    from data import SyntheticFaces
    model, optimizer = model_with(names, 32, 16, 64, seed, device, lr=0.5)
    strategy = losses.get("padded", capacity=16)
    dataset = SyntheticFaces(100, 32, seed)
    values = []
    for k in range(steps):
        images, targets = strategy.collate(
            [dataset[i] for i in range(batch * k, batch * k + batch)])
        with torch.autocast(device, dtype=torch.bfloat16):
            pred = model(images.to(device))
        loss = strategy.loss(pred, strategy.to_device(targets, device))
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        values.append(loss.detach().float().cpu())
    if hasattr(model, "lin1_update"):
        model.lin1_update.join()
    return torch.stack(values), model, optimizer


def with_what_it_needs(name: str, usable) -> list[str]:
    """[name], or where that speed-up would be idle alone (one that builds on another: the
    third block's backward reads its forward's code), it and every speed-up before it in
    the ladder that usable(spec) accepts and that a run on one GPU does not refuse (tp's
    graphed head)."""
    import train
    from training import speedups
    spec = speedups.BY_NAME[name]
    alone = train.Config(**{**speedups.baseline_values(), name: "on" if spec.choice else True})
    asked = train.asked_of(alone)
    if speedups.resolve(asked, cuda=True)["on"][name]:
        return [name]
    before = speedups.ORDER[:speedups.ORDER.index(name) + 1]
    return [n for n in before if usable(speedups.BY_NAME[n])
            and speedups.BY_NAME[n].why_not(asked, cuda=True) is None]


def compiled_trunks_agree(switch: str, *fixed: str) -> None:
    """The trunk as the step compiles it (bf16 autocast, NHWC, the Triton blocks and the
    speed-ups `fixed`, at the GPU preset's image size, batch 8) with and without the
    speed-up `switch`: the same output and parameter gradients within bf16 rounding
    (norm-relative 1e-2)."""
    import torch

    from tests.reference import rel_err
    seed = torch.randint(0, 2**31, ()).item()
    images = torch.randint(0, 256, (8, 1, 256, 256), dtype=torch.uint8,
                           generator=torch.Generator().manual_seed(seed)).cuda()
    switches = {"channels_last", "triton_first_block", "triton_second_block", "triton_pool",
                *fixed}
    outs = []
    for on in (False, True):
        names = switches | {switch} if on else switches - {switch}
        model, _ = model_with(names, 256, 16, 64, seed, "cuda", torch.bfloat16)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            out = torch.compile(model.flat_features)(images)
        out.float().square().sum().backward()
        outs.append((out, [p.grad for p in model.features.parameters()]))
    (out0, grads0), (out1, grads1) = outs
    assert rel_err(out1, out0) < 1e-2
    for g1, g0 in zip(grads1, grads0, strict=True):
        assert ((g1 - g0).norm() / g0.norm()).item() < 1e-2


def copy_of_the_tree(tmp_path: Path) -> Path:
    """The repository's files without its git, venv, runs and builds: a tree that a test
    may change (tests/*/test_adding_one.py)."""
    import shutil
    tree = tmp_path / "tree"
    shutil.copytree(REPO, tree, ignore=shutil.ignore_patterns(
        ".git", ".venv", "profiles", "build", "__pycache__", ".dev", ".pytest_cache"))
    return tree


def python_in(tree: Path, tmp_path: Path, *argv: str, timeout: float = 600):
    """This python on argv in `tree`, its temporary files in tmp_path (not the session's
    TMPDIR, whose every leftover a test's teardown counts)."""
    return subprocess.run([sys.executable, *argv], cwd=tree, capture_output=True, text=True,
                          env={"TMPDIR": str(tmp_path), "PATH": "/usr/bin:/bin"},
                          timeout=timeout)


@contextlib.contextmanager
def gpu_counters_alone():
    """One test at a time, across make test-gpu's workers, that profiles with ncu or reads
    the GPU's energy counter: ncu runs side by side failed, and the energy test beside
    them read no watts (results/correctness.md). The lock is the suite's file
    (tests/gpu_suite.py); a plain pytest run, one process, needs none."""
    import fcntl
    import os

    from tests.gpu_suite import COUNTERS
    path = os.environ.get(COUNTERS)
    if not path:
        yield
        return
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def resolved(cfg, cuda: bool) -> dict:
    """training/speedups.resolve for a train.Config: what a run of it uses."""
    import train
    from training import speedups
    return speedups.resolve(train.asked_of(cfg), cuda)
