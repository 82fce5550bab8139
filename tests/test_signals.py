"""Signals as a terminal, `timeout` or a batch scheduler send them: to the run's whole
process group (its data workers too), and a second one while the run's files are being
written. Each ends with one line, exit 130, a marked folder, and no process left."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.helpers import REPO, TINY, gone, our_lines, signal_after, start_long_run
from training.speedups import ORDER as SPEEDUPS

TRIALS = 4


def _kept_as_interrupted(tmp_path, code, lines, name):
    assert code == 130 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: interrupted ({name}) at step "), lines
    assert [p.name for p in tmp_path.iterdir()] == ["run-interrupted"], lines
    summary = json.loads((tmp_path / "run-interrupted" / "summary.json").read_text())
    assert summary["status"] == "interrupted"
    assert gone(str(tmp_path))


@pytest.mark.parametrize("loader", ("ring", "torch"))
@pytest.mark.parametrize("signum,name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_signal_to_the_whole_group_keeps_the_steps(tmp_path_factory, loader, signum, name):
    rng = random.Random(f"{loader}{name}")
    for trial in range(TRIALS):
        tmp = tmp_path_factory.mktemp(f"group{trial}")
        at = rng.randint(3, 25)
        proc = start_long_run(tmp, "--num-workers", "2", "--loader", loader)
        code, lines = signal_after(proc, f"step {at}/401 (profiled)", signum, group=True)
        _kept_as_interrupted(tmp, code, lines, name)


@pytest.mark.parametrize("loader,tries", [("ring", 10), ("torch", 5)])
def test_sigterm_as_the_loaders_workers_fork_is_never_lost(tmp_path_factory, loader, tries):
    """A SIGTERM 0-20 ms after the loader's line was lost in 3 of 7 tries: its
    KeyboardInterrupt was raised inside an at-fork callback, which swallowed it with an
    "Exception ignored" traceback, and the run exited 0. Spread over that window, every
    try must end 130 with one line, the folder -interrupted or not kept."""
    for trial in range(tries):
        tmp = tmp_path_factory.mktemp(f"fork{trial}")
        proc = start_long_run(tmp, "--num-workers", "2", "--loader", loader)
        delay = 0.05 * trial / tries + random.uniform(0, 0.005)
        code, lines = signal_after(proc, "batches: ", signal.SIGTERM, group=True, delay=delay)
        # Every line in full: pytest cuts a long list short, and the one CI failure of this
        # test (at 509104e: 9 lines, "Exception ignored in thread started by ...
        # QueueFeederThread") showed only the first two.
        told = f"SIGTERM {delay:.4f} s after the line; exit {code}; its lines:\n" + \
            "\n".join(lines)
        assert code == 130 and len(lines) == 1, told
        assert lines[0].startswith("error: interrupted (SIGTERM)"), told
        assert [p.name for p in tmp.iterdir()] in ([], ["run-interrupted"]), told
        assert gone(str(tmp))


def test_a_second_ctrl_c_soon_after_the_first_still_keeps_the_steps(tmp_path_factory):
    for trial, gap in enumerate((0.0, 0.02, 0.05, 0.2)):
        tmp = tmp_path_factory.mktemp(f"twice{trial}")
        proc = start_long_run(tmp, "--num-workers", "2")
        code, lines = signal_after(proc, "step 6/401 (profiled)", signal.SIGINT, group=True,
                                   again=gap)
        _kept_as_interrupted(tmp, code, lines, "Ctrl-C")


def test_ctrl_c_while_a_complete_run_is_written_waits_for_its_files(tmp_path):
    proc = start_long_run(tmp_path, "--active", "30")
    code, lines = signal_after(proc, "writing the trace", signal.SIGINT, group=True)
    assert code == 130 and len(lines) == 1 and "interrupted" in lines[0], lines
    assert ("Ctrl-C received while the trace of 30 profiled steps is written: held until "
            "it is") in proc.rest_of_stdout
    # The run was complete: its folder is too, unsuffixed, with its whole summary.
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["status"] == "complete" and summary["steps"] == 30
    assert gone(str(tmp_path))


def _start_command(module: str, *args, size=None):
    """A study command (studies.<module>) at the LONG size (or `size`: train.py options),
    in a process group of its own, taking Ctrl-C as a terminal gives it."""
    import subprocess
    import sys

    from tests.helpers import LONG, REPO, _ctrl_c_as_a_terminal_gives_it
    return subprocess.Popen([sys.executable, "-u", "-m", f"studies.{module}", *args,
                             *(LONG if size is None else size)],
                            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=_ctrl_c_as_a_terminal_gives_it,
                            start_new_session=True)


COMMAND_TRIALS = 3
FIRST_RUN_S = 300
# Each run's steps: the first run finishes them all, the second is signalled by step 12,
# so 40 leave it 28 to be interrupted in (a line every step: the harness prints every
# step of a run up to 500).
COMMAND_STEPS = 40
# Per command: its --strategies, the progress line of its second run, that run's folder,
# its table, and what it counts.
COMMANDS = {"compare": ("padded,concat", "[2/2] concat", "concat-train", "comparison.md",
                        "2 runs"),
            "ladder": ("padded", "] fused_sgd (", "padded-2-fused_sgd", "ladder.md",
                       f"{len(SPEEDUPS) + 1} rungs")}


@pytest.mark.parametrize("module", COMMANDS)
@pytest.mark.parametrize("signum,name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_signal_to_a_commands_group_keeps_what_finished(tmp_path_factory, module, signum,
                                                          name):
    """make compare and make ladder, their whole group signalled at a random step of the
    second run (the first, 2 profiled steps, finished): one line, exit 130,
    <out>-interrupted holding the first run and a table of it; no process left."""
    strategies, second, run, table, planned = COMMANDS[module]
    rng = random.Random(f"{module}{name}")
    for trial in range(COMMAND_TRIALS):
        tmp = tmp_path_factory.mktemp(f"{module}{trial}")
        at = rng.randint(2, 12)
        args = ["--strategies", strategies, "--out", str(tmp / "out")]
        proc = _start_command(module, *args, *(["--modes", "train"] if module == "compare"
                                               else []),
                              size=TINY + ["--steps", str(COMMAND_STEPS)])
        # Two bounds, each for what its message names: the first run (its steps and the
        # process's start, slow on 2 loaded cores), then step `at` of the second.
        in_second, deadline = False, time.time() + FIRST_RUN_S
        try:
            for line in proc.stdout:
                if not in_second and second in line:
                    in_second, deadline = True, time.time() + 120
                if in_second and f"step {at}/{COMMAND_STEPS} " in line:
                    os.killpg(proc.pid, signum)
                    break
                assert time.time() < deadline, (
                    f"no step {at} of the second run in 120 s" if in_second
                    else f"the second run did not start in {FIRST_RUN_S} s")
            _, err = proc.communicate(timeout=120)
        finally:
            if proc.poll() is None:  # a failed trial must not run on
                os.killpg(proc.pid, signal.SIGKILL)
        lines = our_lines(err)
        kept = tmp / "out-interrupted"
        assert proc.returncode == 130 and len(lines) == 1, lines
        assert lines[0].startswith(f"error: interrupted ({name}) at step "), lines
        assert lines[0].endswith(f"; kept in {kept} (1 of {planned} finished)"), lines
        names = sorted(p.name for p in kept.iterdir())
        # The interrupted run: marked, or removed if no profiled step had completed;
        # never a folder that looks complete.
        assert table in names and run not in names, names
        assert (kept / table).read_text().startswith("**Interrupted** after ")
        assert gone(str(tmp))


@pytest.mark.parametrize("signum,name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_signal_to_make_sweeps_group_keeps_its_points(tmp_path_factory, signum, name):
    rng = random.Random(f"sweep{name}")
    for trial in range(COMMAND_TRIALS):
        tmp = tmp_path_factory.mktemp(f"sweep{trial}")
        at = rng.randint(2, 5)
        proc = _start_command("sweep", "--out", str(tmp / "out"), "--strategies",
                              "padded,concat", "--rep-ms", "20", size=[])
        code, lines = signal_after(proc, f"[{at}/", signum, group=True)
        kept = tmp / "out-interrupted"
        assert code == 130 and len(lines) == 1, lines
        assert lines[0].startswith(f"error: interrupted ({name}); kept in {kept} ("), lines
        assert lines[0].endswith(" points measured)"), lines
        assert (kept / "sweep.md").read_text().startswith("**Interrupted**")
        assert gone(str(tmp))


@pytest.mark.parametrize("signum,name", [(signal.SIGTERM, "SIGTERM"), (signal.SIGINT, "Ctrl-C")])
def test_a_signal_to_make_compare_marks_its_run_and_says_so(tmp_path, signum, name):
    """SIGTERM to make compare's group used to kill it silently, its run folder unmarked;
    now, as Ctrl-C: one line, exit 130, the run kept as -interrupted, nothing left."""
    out = tmp_path / "cmp"
    proc = _start_command("compare", "--out", str(out), "--strategies", "padded",
                          "--modes", "train")
    code, lines = signal_after(proc, "step 6/401 (profiled)", signum, group=True)
    assert code == 130 and len(lines) == 1, lines
    assert lines[0].startswith(f"error: interrupted ({name}) at step "), lines
    # The comparison's own folder is marked too, and holds the run's (no claim left).
    kept = tmp_path / "cmp-interrupted"
    assert lines[0].endswith(f"; kept in {kept} (0 of 1 runs finished)"), lines
    assert [p.name for p in tmp_path.iterdir()] == ["cmp-interrupted"]
    assert [p.name for p in kept.iterdir()] == ["padded-train-interrupted"], lines
    assert gone(str(tmp_path))


def test_sigterm_to_make_ladder_alone_stops_its_rung_and_leaves_no_process(tmp_path):
    """kill -TERM of make ladder's own process (not its group): its group's process gets
    Ctrl-C, marks its rung, and ends; nothing is orphaned (it used to run on)."""
    out = tmp_path / "lad"
    proc = _start_command("ladder", "--out", str(out), "--strategies", "padded")
    code, lines = signal_after(proc, "step 6/401 (profiled)", signal.SIGTERM)
    assert code == 130 and len(lines) == 1, lines
    # The signal this process got, the step its group's rung was at, and the ladder's own
    # folder marked around the rung's.
    kept = tmp_path / "lad-interrupted"
    assert lines[0].startswith("error: interrupted (SIGTERM) at step "), lines
    assert lines[0].endswith(f"; kept in {kept} (0 of {len(SPEEDUPS) + 1} rungs finished)"), \
        lines
    assert [p.name for p in tmp_path.iterdir()] == ["lad-interrupted"]
    assert [p.name for p in kept.iterdir() if p.name.endswith("-interrupted")] == \
        ["padded-0-baseline-interrupted"], sorted(p.name for p in kept.iterdir())
    assert gone(str(tmp_path))


@pytest.mark.parametrize("signum", (signal.SIGTERM, signal.SIGINT))
def test_a_stop_signal_while_a_command_leaves_changes_nothing(signum):
    """torchrun's SIGTERM to every rank after one failed reached a rank in the
    interpreter's exit callbacks, and stop_once's KeyboardInterrupt printed a traceback
    there (the launcher's one-line refusal became 17 lines, a fresh-clone CI run). Now
    the command leaves with its own code and says nothing more."""
    script = f"""
import atexit, os, time
from core.commands import command, run_command

def exit_callback():
    os.kill(os.getpid(), {int(signum)})
    time.sleep(0.2)  # the signal lands here
    print("the exit callbacks ran on", flush=True)

atexit.register(exit_callback)
run_command(command(lambda argv: 3), "nothing was written")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert (done.returncode, done.stderr) == (3, "")
    assert done.stdout == "the exit callbacks ran on\n"


def test_a_swallowed_stop_signal_never_ends_a_command_with_0():
    """make ladder SIGTERMed as it wrote its tables exited 0 with no word of the signal:
    some code on the way swallowed its KeyboardInterrupt. The command's 0 becomes 130."""
    script = """
import os, signal
from core.commands import command, run_command

def body(argv):
    try:
        os.kill(os.getpid(), signal.SIGTERM)
    except KeyboardInterrupt:
        pass  # what an at-fork callback or a finalizer does
    print("written: the tables", flush=True)
    return 0

run_command(command(body), "the ladder was not written")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 130 and done.stdout == "written: the tables\n"
    assert done.stderr == ("error: interrupted (SIGTERM) as the command ended; what it said "
                           "it wrote is whole\n")


def test_a_signal_as_a_studys_tables_are_written_lets_them_be_written_whole(tmp_path):
    """make compare SIGTERMed after its runs, as it wrote its table, left a folder of runs
    with no table and no suffix. From tables_follow() on the signal is noted: the tables
    are written whole, and the command exits 130 saying so."""
    out = tmp_path / "cmp"
    script = f"""
import os, signal
from pathlib import Path
from core.commands import command, run_command
from studies import common

def body(argv):
    out = common.fresh_out(Path({str(out)!r}), "comparison", "compare")
    common.tables_follow()
    os.kill(os.getpid(), signal.SIGTERM)  # as the table is written
    (out / "comparison.md").write_text("the table\\n")
    print("written: the table", flush=True)
    return 0

run_command(command(body), "the comparison was not written")
"""
    done = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True,
                          text=True, timeout=120)
    assert (done.returncode, done.stdout) == (130, "written: the table\n"), done.stderr
    assert done.stderr == ("error: interrupted (SIGTERM) as the command ended; what it said "
                           "it wrote is whole\n")
    assert (out / "comparison.md").read_text() == "the table\n"


# SIGNAL_MOMENTS=50 for the measure (each moment is one short life: 2-5 s for a
# run, 3-8 s for make compare on 2 cores); the suite takes 8, a fresh offset each time.
MOMENTS = int(os.environ.get("SIGNAL_MOMENTS", "8"))
SHORT = [*TINY, "--num-workers", "2", "--steps", "6"]


def _short_life(kind: str, out):
    """A short run (train.py) or make compare (two strategies, train mode) in a process
    group of its own, taking Ctrl-C as a terminal gives it."""
    if kind == "run":
        from tests.helpers import _ctrl_c_as_a_terminal_gives_it
        return subprocess.Popen([sys.executable, "-u", "train.py", *SHORT, "--out-dir",
                                 str(out), "--run-name", "run"], cwd=REPO,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_ctrl_c_as_a_terminal_gives_it,
                                start_new_session=True)
    return _start_command("compare", "--strategies", "padded,concat", "--modes", "train",
                          "--out", str(out / "cmp"), size=SHORT)


def _exiting(pid: int) -> bool:
    """Whether the process is already in its exit (Linux's PF_EXITING in /proc's flags),
    or gone: its code decided, its address space being unmapped (tens of ms for a torch
    process under load), so no program can act on a signal that lands now. Three of 40
    SIGTERMs in make compare's last 0.5 s exited 0, each with PF_EXITING set as it was
    sent; every one sent before it ended 130. Read right after the send: a process that
    began its exit after the signal came would have run its handler first."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return True
    return bool(int(fields[6]) & 0x4)  # the task's flags; PF_EXITING


@pytest.mark.parametrize("kind", ["run", "compare"])
def test_sigterm_at_evenly_spread_moments_of_a_short_life_is_never_lost(tmp_path_factory,
                                                                         kind):
    """SIGTERM to the whole group at MOMENTS moments spread evenly over a short life,
    from its first instruction to its exit (before the loader, as its workers start,
    inside a step, in the profiler's writing, between make compare's runs, as it leaves):
    a SIGTERM 0-20 ms after the loader's line was lost in 3 of 7 tries, and make compare
    SIGTERMed at 6 s finished its 24 runs and exited 0. Each moment: exit 130, one line,
    no traceback, and every folder -interrupted (or none)."""
    whole = tmp_path_factory.mktemp(f"{kind}-whole")
    started = time.monotonic()
    life = _short_life(kind, whole)
    out, err = life.communicate(timeout=600)
    span = time.monotonic() - started
    assert life.returncode == 0, err[-2000:]
    offset = random.random()
    for moment in range(MOMENTS):
        at = span * (moment + offset) / MOMENTS
        tmp = tmp_path_factory.mktemp(f"{kind}{moment}")
        proc = _short_life(kind, tmp)
        time.sleep(at)
        # This life was shorter: past its end (a zombie still has its group), no moment of
        # it. Between this look and the signal: microseconds.
        if os.waitid(os.P_PID, proc.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None:
            proc.communicate()
            continue
        os.killpg(proc.pid, signal.SIGTERM)
        exiting = _exiting(proc.pid)
        _, err = proc.communicate(timeout=300)
        where = f"{kind} at {at:.2f} s of {span:.2f}"
        lines = our_lines(err)
        if exiting and proc.returncode == 0:
            continue  # the signal came as the kernel tore the exiting process down
        assert proc.returncode != 0, f"{where}: exit 0, the SIGTERM lost"
        if proc.returncode == -signal.SIGTERM:  # in Python's own start, before any code
            assert err == "" and not list(tmp.iterdir()), (where, err)  # of ours ran
            continue
        assert proc.returncode == 130 and len(lines) == 1, (where, proc.returncode, lines)
        assert lines[0].startswith("error: interrupted (SIGTERM)"), (where, lines)
        assert "Traceback" not in err and "Exception ignored" not in err, (where, err)
        for folder in tmp.iterdir():  # the run's, or make compare's with its runs inside
            if folder.name.endswith("-interrupted"):
                continue
            # A signal held while a complete run's files were written, or that came as
            # the command ended: the folder is whole and says so, its line too ("what it
            # said it wrote is whole"; test_ctrl_c_while_a_complete_run_is_written_...).
            if (folder / "comparison.md").exists():
                table = (folder / "comparison.md").read_text()
                assert not table.startswith("**Interrupted**"), (where, folder)
                continue
            summary = json.loads((folder / "summary.json").read_text())
            assert summary["status"] == "complete", (where, folder, summary["status"])
        assert gone(str(tmp)), where
