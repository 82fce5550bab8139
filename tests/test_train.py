"""train.py on CPU: a short profiled run writes a gzip trace and a complete summary; runs
never overwrite each other; user mistakes stop with one line and a non-zero exit."""

import gzip
import json
import subprocess
import sys
from pathlib import Path

import pytest

import train

REPO = Path(__file__).resolve().parent.parent
TINY = ["--preset", "cpu", "--batch-size", "4", "--image-size", "32", "--hidden", "32",
        "--num-workers", "0", "--wait", "0", "--warmup", "1", "--active", "2"]


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
    assert summary["steps"] == 2
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


def _our_lines(stderr: str) -> list[str]:
    """stderr without libkineto's 'USDT:' markers (torch 2.13's CPU build prints them on
    every profiled run; no setting turns them off)."""
    return [line for line in stderr.strip().splitlines() if not line.startswith("USDT:")]


def _cli(*args):
    return subprocess.run([sys.executable, "train.py", *TINY, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("args,message", [
    (["--loss", "nope"], "unknown loss strategy 'nope': choose one of loop, concat"),
    (["--mode", "backward"], "unknown mode"),
    (["--max-boxes", "1", "--num-workers", "1", "--batch-size", "16"],
     "boxes but the model predicts only 1: raise --max-boxes"),
])
def test_user_mistakes_stop_with_one_line(tmp_path, args, message):
    result = _cli("--out-dir", str(tmp_path), *args)
    assert result.returncode == 2, result.stderr
    lines = _our_lines(result.stderr)
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_gpu_only_options_without_gpu(tmp_path):
    import torch
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    for args, message in ((["--loss", "kernel", "--kernel", "cuda"], "needs a CUDA GPU"),
                          (["--preset", "gpu"], "the gpu preset needs a CUDA GPU")):
        result = _cli("--out-dir", str(tmp_path), *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert len(_our_lines(result.stderr)) == 1
    assert not list(tmp_path.iterdir()), "an error before the run must write nothing"


def test_fused_strategy_from_the_command_line_without_gpu(tmp_path):
    """train.py must choose Triton's interpreter itself on a CPU machine (the test suite's
    conftest sets it too, so the subprocess runs without it)."""
    import os
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
    import os
    cores = sorted(os.sched_getaffinity(0))
    assert train.split_cores(0) is None
    if len(cores) < 2:
        pytest.skip("needs two cores")
    main, workers = train.split_cores(1)
    assert main == {cores[0]} and workers == set(cores[1:])
    result = _cli("--out-dir", str(tmp_path), "--main-cores", str(len(cores)))
    assert result.returncode == 2 and "leaves no core for the data workers" in result.stderr
    # A run with the split, then one without, in this process (as make compare runs them):
    # the first narrows the main thread to one core, the second gets every core back.
    _run(tmp_path, "--main-cores", "1", "--num-workers", "1")
    assert os.sched_getaffinity(0) == {cores[0]}
    _run(tmp_path, "--num-workers", "1")
    assert sorted(os.sched_getaffinity(0)) == cores


def test_a_kept_model_starts_each_run_from_the_same_weights(tmp_path):
    """make compare keeps one model per process; every run must start as a fresh one."""
    fresh = _run(tmp_path, "--mode", "train")["losses"]
    args = TINY + ["--out-dir", str(tmp_path), "--mode", "train"]
    first = train.run(train.parse_config(args), reuse=True)["losses"]
    kept_model = train._kept["model"]
    second = train.run(train.parse_config(args), reuse=True)
    assert train._kept["model"] is kept_model  # the same module, so no recompile
    assert first == fresh and second["losses"] == fresh  # training moved the weights; restored
    assert Path(second["run_dir"]).parent == tmp_path
    train._kept.clear()


def test_git_commit_names_a_copied_tree(monkeypatch):
    monkeypatch.setenv("GIT_COMMIT", "0123abc")
    env = train.environment()
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
