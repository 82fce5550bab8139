"""train.py on CPU: a short profiled run writes a gzip trace and a complete summary; runs
never overwrite each other; every user mistake stops with one line, a non-zero exit and
nothing written."""

import gzip
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

import train
from core.errors import UserError
from profiling import flops
from tests.helpers import REPO, TINY, cli, one_line_and_nothing_written, our_lines


def _run(tmp_path, *extra):
    return train.run(train.parse_config(TINY + ["--out-dir", str(tmp_path), *extra]))


@pytest.mark.parametrize("loss", ("loop", "padded", "conditional"))
@pytest.mark.parametrize("mode", ("train", "forward"))
def test_profile_run_writes_trace_and_summary(tmp_path, loss, mode):
    _run(tmp_path, "--loss", loss, "--mode", mode)
    (run_dir,) = list(tmp_path.iterdir())
    (trace,) = list(run_dir.glob("*.pt.trace.json.gz"))
    with gzip.open(trace, "rt") as f:
        assert json.load(f)["traceEvents"]
    assert list(run_dir.glob("events.out.tfevents.*")), "no TensorBoard scalars"
    summary = json.loads((run_dir / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["steps"] == 2
    expected = {"data", "copy", "forward", "loss"} | (
        {"loss_backward", "backward", "optimizer"} if mode == "train" else set())
    assert set(summary["phases"]) == expected
    for name, phase in summary["phases"].items():
        assert phase["cpu_ms"] > 0, name
    assert summary["step"]["cpu_ms"] > 0
    assert summary["config"]["loss"] == loss and summary["config"]["mode"] == mode
    for key in ("device", "torch", "triton", "cuda", "commit", "date"):
        assert key in summary["environment"]
    assert "| loss" in summary["table"]
    # The model's FLOPs are counted on a CPU too; its MFU is the GPU's alone.
    cfg = summary["config"]
    assert summary["flops"]["tflop"] * 1e12 == flops.step_flops(
        cfg["batch_size"], cfg["image_size"], cfg["max_boxes"], cfg["hidden"], mode)
    assert summary["flops"]["mfu"] is None and "MFU -: no GPU time" in summary["table"]
    assert summary["compile"] is None  # the CPU preset does not compile


def test_a_second_run_leaves_the_first_untouched(tmp_path):
    _run(tmp_path, "--run-name", "same")
    first = tmp_path / "same"
    before = {p: p.read_bytes() for p in first.iterdir()}
    _run(tmp_path, "--run-name", "same")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["same", "same-2"]
    assert {p: p.read_bytes() for p in first.iterdir()} == before


def test_same_seed_same_losses_across_strategies(tmp_path):
    a = _run(tmp_path, "--loss", "loop", "--mode", "forward")
    b = _run(tmp_path, "--loss", "padded", "--mode", "forward")
    assert a["losses"] == pytest.approx(b["losses"], rel=1e-5)


@pytest.mark.parametrize("args,message", [
    (["--loss", "nope"], "argument --loss: invalid choice: 'nope' (choose from 'loop', "
                         "'concat'"),
    (["--mode", "backward"], "argument --mode: invalid choice: 'backward'"),
    (["--kernel", "bogus"], "argument --backend/--kernel: invalid choice: 'bogus'"),
    (["--seed", "-1"], "--seed must not be negative"),
    (["--dataset-length", "-5"], "--dataset-length must be at least 1"),
    (["--dataset-length", "5"], "3 steps of 4 need more than the 5 samples"),
    (["--lr", "nan"], "--lr must be a positive number, got nan"),
    (["--lr", "-1"], "--lr must be a positive number, got -1.0"),
    (["--image-size", "40"], "image size 40 must be a multiple of 16"),
    (["--run-name", "../escaped"], "--run-name '../escaped' must be a plain folder name"),
    (["--run-name", "x-failed"], "ends like a run that ended early"),
    (["--run-name", "r" * 250], "--run-name is 250 bytes long: a run folder's name may have "
                                "at most 243"),
    (["--bucket-mb", "0"], "--bucket-mb must be a positive number, got 0.0"),
    (["--hang-timeout", "0"], "--hang-timeout must be a positive number of seconds, got 0.0"),
    (["--comm-hook", "bf16", "--no-overlap"], "--comm-hook bf16 is a DDP hook"),
    (["--scaling-baseline", "/nonexistent"], "--scaling-baseline: cannot read "
                                             "/nonexistent/summary.json"),
    # Found in the first batch, after the run folder was made: the folder goes again.
    (["--max-boxes", "1", "--num-workers", "1", "--batch-size", "16"],
     "boxes but the model predicts only 1: raise --max-boxes"),
])
def test_user_mistakes_stop_with_one_line(tmp_path, args, message):
    out = tmp_path / "out"
    one_line_and_nothing_written(cli("--out-dir", str(out), *args), out, message)
    assert not (tmp_path.parent / "escaped").exists()


@pytest.mark.parametrize("field,value", [("mode", "backward"), ("loss", "nope"),
                                         ("backend", "bogus")])
def test_a_config_made_in_python_is_checked_too(tmp_path, field, value):
    import dataclasses
    cfg = dataclasses.replace(train.parse_config(TINY + ["--out-dir", str(tmp_path)]),
                              **{field: value})
    with pytest.raises(train.UserError, match=f"unknown --{field} '{value}': choose one of"):
        train.run(cfg)
    assert not list(tmp_path.iterdir())


def test_out_dir_that_is_a_file_or_not_writable(tmp_path):
    a_file = tmp_path / "a-file"
    a_file.write_text("x")
    result = cli("--out-dir", str(a_file / "runs"))
    one_line_and_nothing_written(result, tmp_path / "none", "is a file, not a folder")
    assert a_file.read_text() == "x"
    # /proc refuses new folders even to root (CI runs as root, so chmod would not do).
    result = cli("--out-dir", "/proc/ragged-targets-test")
    assert result.returncode == 2, result.stderr[-2000:]
    lines = our_lines(result.stderr)
    assert len(lines) == 1 and "cannot make the run folder /proc/ragged-targets-test/" in \
        lines[0], lines


def test_a_relative_out_dir_is_relative_to_the_current_folder(tmp_path):
    result = cli("--out-dir", "rel", "--run-name", "here", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert (tmp_path / "rel" / "here" / "summary.json").exists()
    assert not (REPO / "rel").exists()


def test_help_without_torch_shows_choices_and_both_presets():
    """--help needs no torch (the stack may live in .venv); a run without it says how to
    get it, in one line."""
    hide_torch = ("import runpy, sys; sys.modules['torch'] = None; sys.argv = sys.argv[1:]; "
                  "runpy.run_path(sys.argv[0], run_name='__main__')")
    done = subprocess.run([sys.executable, "-c", hide_torch, "train.py", "--help"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    from core.names import STRATEGIES  # the choices come from the registry, whatever it holds
    assert "{" + ",".join(STRATEGIES) + "}" in done.stdout
    assert "{triton,cuda}" in done.stdout and "{train,forward}" in done.stdout
    assert "(default 1024; cpu preset 32)" in " ".join(done.stdout.split())
    done = subprocess.run([sys.executable, "-c", hide_torch, "train.py"], cwd=REPO,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert our_lines(done.stderr) == [next(line for line in our_lines(done.stderr))]
    assert "torch is not installed" in done.stderr and "make profile" in done.stderr


def test_gpu_only_options_without_gpu(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for args, message in ((["--loss", "kernel", "--backend", "cuda"],
                           "needs a CUDA GPU and nvcc: use the Triton backend (make: "
                           "BACKEND=triton; train.py: --backend triton)"),
                          (["--preset", "gpu"], "the gpu preset needs a CUDA GPU")):
        one_line_and_nothing_written(cli("--out-dir", str(tmp_path), *args), tmp_path,
                                      message)


def test_fused_strategy_from_the_command_line_without_gpu(tmp_path):
    """train.py must choose Triton's interpreter itself on a CPU machine (the test suite's
    conftest sets it too, so the subprocess runs without it)."""
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run([sys.executable, "train.py", *TINY, "--loss", "kernel",
                             "--out-dir", str(tmp_path)], cwd=REPO, capture_output=True,
                            text=True, timeout=600, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "| loss" in result.stdout


def test_main_cores_split_the_cores_between_training_and_workers(tmp_path):
    from data.loader import split_cores, start_cores
    cores = sorted(start_cores())
    assert split_cores(0) is None
    if len(cores) < 2:
        pytest.skip("needs two cores")
    main, workers = split_cores(1)
    assert main == {cores[0]} and workers == set(cores[1:])
    result = cli("--out-dir", str(tmp_path), "--main-cores", str(len(cores)))
    assert result.returncode == 2 and "leaves no core for the data workers" in result.stderr
    # A run with the split, then one without, in this process (as make compare runs them):
    # the first narrows the main thread to one core, the second gets every core back.
    try:
        _run(tmp_path, "--main-cores", "1", "--num-workers", "1")
        assert os.sched_getaffinity(0) == {cores[0]}
        _run(tmp_path, "--num-workers", "1")
        assert sorted(os.sched_getaffinity(0)) == cores
    finally:
        os.sched_setaffinity(0, cores)


def test_each_rank_keeps_to_its_share_of_whole_cores():
    from data.loader import share_of, split_cores
    # 8 hardware threads on 4 physical cores, siblings c and c + 4 (Linux numbers them so)
    siblings = {c: [c % 4, c % 4 + 4] for c in range(8)}.get
    shares = [share_of(list(range(8)), i, 2, siblings) for i in range(2)]
    assert shares == [[0, 4, 1, 5], [2, 6, 3, 7]]
    assert [share_of(list(range(8)), i, 4, siblings) for i in range(4)] == [
        [0, 4], [1, 5], [2, 6], [3, 7]]
    assert share_of([0, 1, 2], 1, 3) == [1]  # no siblings known: a core each
    with pytest.raises(UserError, match="4 ranks on this host and 2 physical cores"):
        share_of([0, 4, 1, 5], 0, 4, siblings)
    if len(os.sched_getaffinity(0)) >= 2:
        main, workers = split_cores(0, (1, 2))
        assert main == workers and len(main) >= 1  # the rank's share, for both


def test_a_kept_model_starts_each_run_from_the_same_weights(tmp_path):
    """make compare keeps one model per process; every run must start as a fresh one."""
    from model import forget_kept_model, kept_model
    fresh = _run(tmp_path, "--mode", "train")["losses"]
    args = TINY + ["--out-dir", str(tmp_path), "--mode", "train"]
    try:
        first = train.run(train.parse_config(args), reuse=True)["losses"]
        kept = kept_model()
        second = train.run(train.parse_config(args), reuse=True)
        assert kept_model() is kept  # the same module, so no recompile
        assert first == fresh and second["losses"] == fresh  # trained, then restored
        assert Path(second["run_dir"]).parent == tmp_path
    finally:
        forget_kept_model()


def test_every_new_model_of_a_process_is_compiled(monkeypatch):
    """make ladder builds a model a rung in one process, each compiling the same
    BoxNet.forward: a new model must not count against Dynamo's recompile limit, past
    which the frame runs eagerly (the limit set to 1 here, 8 in torch)."""
    import functools

    import torch._dynamo
    from torch._dynamo.utils import counters

    from model import build_model, forget_kept_model

    class Transform:  # what a ladder rung's speed-ups are to build_model: a key
        def __init__(self, key):
            self.key = key

        def __call__(self, model):
            pass

    monkeypatch.setattr(torch, "compile", functools.partial(torch.compile, backend="eager"))
    images = torch.randint(0, 256, (2, 1, 16, 16), dtype=torch.uint8)
    forget_kept_model()
    torch._dynamo.reset()  # what other tests of this process compiled
    # The config's own patch, not monkeypatch: torch 2.13's config module hid the field
    # for good once monkeypatch set it back, and every later compile in the process
    # failed ("torch._dynamo.config.recompile_limit does not exist").
    with torch._dynamo.config.patch(recompile_limit=1):
        try:
            for key in ("first", "second", "third"):
                graphs = counters["stats"]["unique_graphs"]
                _, runner = build_model(16, 2, 8, True, 0, torch.device("cpu"), reuse=True,
                                        transform=Transform(key))
                runner(images)
                assert counters["stats"]["unique_graphs"] > graphs, key
        finally:
            forget_kept_model()


def test_a_replaced_kept_model_in_a_cycle_is_freed_before_the_next_is_built():
    """A kept model in a reference cycle (lin1's update beside the trunk rebinds
    model.head to the model's own method) is collected when another replaces it, before
    the new one is built: make ladder's rung after it counted the old model's memory in
    its own peak."""
    import gc
    import weakref

    import torch

    from model import build_model, forget_kept_model

    class Cycle:  # a rung's transform: a key, and a model that refers to itself
        def __init__(self, key):
            self.key = key

        def __call__(self, model):
            model.itself = [model]

    forget_kept_model()
    gc.disable()  # no automatic collection between the two builds: only build_model's
    try:
        first = build_model(16, 2, 8, False, 0, torch.device("cpu"), reuse=True,
                            transform=Cycle("first"))[0]  # its runner is itself
        old = weakref.ref(first)
        del first
        seen = []
        build_model(16, 2, 8, False, 0, torch.device("cpu"), reuse=True,
                    transform=lambda model: seen.append(old() is None))
        assert seen == [True]  # freed before the new model was made
    finally:
        gc.enable()
        forget_kept_model()


def test_git_commit_names_a_copied_tree(monkeypatch):
    from profiling.environment import environment
    monkeypatch.setenv("GIT_COMMIT", "0123abc")
    env = environment()
    assert env["commit"] == "0123abc" and env["dirty"] is None


@pytest.mark.parametrize("mode", ("forward", "train"))
def test_a_step_releases_its_tensors_before_the_next_step(tmp_path, monkeypatch, mode):
    """Freeing a step's autograd graph must not land in the next step's ranges: when the
    loss of step k runs, the predictions of step k-1 (and the graph they hold) are gone."""
    import dataclasses
    import weakref

    import losses
    previous, alive_at_loss = [], []
    real_get = losses.get

    def get(*args, **kwargs):
        strategy = real_get(*args, **kwargs)

        def loss(pred, targets):
            alive_at_loss.append(bool(previous) and previous[-1]() is not None)
            previous.append(weakref.ref(pred))
            return strategy.loss(pred, targets)
        return dataclasses.replace(strategy, loss=loss)

    monkeypatch.setattr(losses, "get", get)
    _run(tmp_path, "--loss", "padded", "--mode", mode)
    assert alive_at_loss == [False, False, False]


def test_a_run_longer_than_its_profiled_window(tmp_path):
    record = _run(tmp_path, "--steps", "7", "--settle", "1")
    assert record["steps_run"] == 7 and len(record["losses"]) == 7
    assert record["steps"] == 2  # the profiled window: --active 2
    assert record["sustained"]["steps"] == 6 and record["sustained"]["timer"] == "host wall"
    assert len(record["step_times"]) == 7


def test_a_time_budget_ends_the_run_after_the_profiled_window(tmp_path, capsys):
    record = _run(tmp_path, "--steps", "1000", "--seconds", "0.5")
    assert 3 <= record["steps_run"] < 1000 and record["status"] == "complete"
    assert "s of steps reached: the run ends after" in capsys.readouterr().out


@pytest.mark.parametrize("args,message", [
    (["--steps", "2"], "--steps 2 is shorter than the profiled window"),
    (["--seconds", "-1"], "--seconds must be a number of seconds, 0 or more"),
    (["--settle", "-1"], "--settle must not be negative"),
    (["--steps", "6", "--settle", "6"], "--settle 6 leaves none of the run's 6 steps"),
    (["--seconds", "5"], "--seconds ends a run once its profiled window is done")])
def test_long_run_options_are_checked(tmp_path, args, message):
    with pytest.raises(UserError, match=message):
        train.validate(train.parse_config(TINY + ["--out-dir", str(tmp_path), *args]))


@pytest.mark.parametrize("change,named", [
    (["--batch-size", "8"], "batch 8 there, 4 here"),
    (["--loss", "concat"], "strategy concat there, padded here"),
    (["--mode", "forward"], "mode forward there, train here"),
    (["--image-size", "64"], "image size 64 there, 32 here"),
    (["--max-boxes", "64"], "capacity 64 there, 256 here")])
def test_a_scaling_baseline_unlike_the_job_is_refused(tmp_path, change, named):
    """The one-GPU run a job scales against must be the job's own run on one GPU: another
    batch, strategy, mode or workload is one line before anything runs."""
    import dataclasses
    import json
    base = tmp_path / "base"
    base.mkdir()
    config = dataclasses.asdict(train.parse_config(TINY + change))
    (base / "summary.json").write_text(json.dumps({"status": "complete", "config": config}))
    out = tmp_path / "out"
    one_line_and_nothing_written(
        cli("--out-dir", str(out), "--scaling-baseline", str(base)), out,
        f"--scaling-baseline {base} is not this job's run on one GPU ({named})")


@pytest.mark.parametrize("after", ["step 1/", "step 5/", "step 8/"])
def test_a_disk_that_turns_read_only_mid_run_is_one_true_line(tmp_path, after):
    """The run folder's file system remounted read-only after `after` (before, inside and
    after the profiled window): TensorBoard's writer thread printed two tracebacks and
    kineto its ERROR line, then 'nothing kept' beside a folder that stayed. Now one line,
    exit 1, that says the folder could not be removed."""
    from tests.helpers import nearly_full_disk
    with nearly_full_disk(tmp_path / "disk", free_kb=1900) as disk:
        proc = subprocess.Popen([sys.executable, "-u", "train.py", "--preset", "cpu",
                                 "--steps", "40", "--out-dir", str(disk / "out"),
                                 "--run-name", "job"], cwd=REPO, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
        for line in proc.stdout:
            if after in line:
                _remount_read_only(disk)
                break
        _, err = proc.communicate(timeout=300)
        lines = our_lines(err)
        folder = disk / "out" / "job"
        assert proc.returncode == 1 and len(lines) == 1, err[-3000:]
        assert lines[0].startswith("error: run failed at step "), lines
        assert ": Read-only file system; " in lines[0] and "b'" not in lines[0], lines
        if folder.exists():  # it could not be removed, and the line says so
            assert lines[0].endswith(f"{folder} could not be removed (Read-only file "
                                     "system): it holds what was written before"), lines
        else:
            assert lines[0].endswith("; nothing kept"), lines


def _remount_read_only(disk) -> None:
    """Linux refuses (EBUSY) while a file on the disk is open for writing (the profiler's
    trace, a scalar being appended): tried again every 10 ms, 5 s at most."""
    deadline = time.monotonic() + 5
    while subprocess.run(["mount", "-o", "remount,ro", str(disk)],
                         capture_output=True).returncode != 0:
        assert time.monotonic() < deadline, "the disk could not be made read-only in 5 s"
        time.sleep(0.01)


def test_a_full_disk_while_the_trace_is_written_is_one_line(tmp_path):
    """A real full disk (a small tmpfs): the profiler's writer stops without a word and
    leaves a trace cut short. The run says the disk is full, in one line, exit 1, and
    leaves no folder that looks complete."""
    from tests.helpers import nearly_full_disk
    with nearly_full_disk(tmp_path / "disk") as disk:
        done = cli("--out-dir", str(disk / "out"))
        lines = our_lines(done.stderr)
        assert done.returncode == 1 and len(lines) == 1, done.stderr[-2000:]
        assert lines[0].startswith("error: run failed after step 3 of 3: could not write ")
        assert lines[0].endswith(": No space left on device (the disk is full); nothing kept")
        assert not list((disk / "out").iterdir())
