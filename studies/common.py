"""What every study (make compare, ladder, sweep) shares: the strategies it was asked for,
its output folder, the runs' configs and one run that may fail without ending the study."""

import dataclasses
import sys
import traceback
from pathlib import Path

import train
from core.errors import (
    StudyInterrupted,
    UserError,
    interruption,
    is_write_failure,
    one_line,
)
from core.files import claim, is_made_here, made_here, release_claims
from core.names import describe
from core.run_folder import check_out_dir, display, mark, new_run_dir, utc_stamp
from core.signals import note_stop_signals, stop_signals_held
from training.ranks import from_env

SKIPPED = "skipped.json"  # rows that could not run, kept beside the runs for a rebuild


def tables_follow() -> None:
    """The study's runs are over and only its tables, charts and page are left to write: a
    Ctrl-C or SIGTERM from here on is noted, not raised, so that they are written whole,
    and the command then exits 130 saying so (core.commands.leave). Raised, it left the
    folder with its runs but no table and no suffix."""
    note_stop_signals()


def write_page(out: Path, markdown: str) -> None:
    """The study folder's index.html (profiling/report_page.py), its path the study's last
    line: a page to open beside the markdown, the CSV and the charts."""
    from profiling import report_page
    page = report_page.write_study(out, markdown)
    print(f"page: {display(page)} (open it in a browser)")


def folder_name(loss: str, backend: str) -> str:
    """How run folders name a strategy: 'kernel-cuda', 'padded'."""
    return describe(loss, backend).replace("/", "-")


def fresh_out(out: Path | None, kind: str, prefix: str) -> Path:
    """The study's output folder: a new profiles/<prefix>-<UTC time>[-N]/, or --out if it
    holds no <kind> yet (a study is never overwritten). Made and noted with Ctrl-C and
    SIGTERM held (acted on after), so that the command's end removes it while empty."""
    if out is None:
        with stop_signals_held():
            made = new_run_dir(check_out_dir("profiles"), f"{prefix}-{utc_stamp()}")
            made_here(made)
        return made
    check_out_dir(str(out), "--out")
    if (out / f"{kind}.md").exists() or (out / SKIPPED).exists():
        raise UserError(f"{out} already holds a {kind}; choose a new --out (a {kind} is "
                        "never overwritten)")
    with stop_signals_held():
        if not out.exists():
            try:
                out.mkdir(parents=True)
            except OSError as exc:  # /proc, say: writable as root, yet no folder is made
                raise UserError(f"--out {out}: cannot make the folder ({exc.strerror})") \
                    from None
            made_here(out)
        claim(out, kind, f"make {prefix}")
    return out


def ranks_out(ranks, out: Path | None, kind: str, prefix: str) -> Path:
    """fresh_out() for a study that every rank of a torchrun job runs (make compare,
    throughput or scaling with GPUS=N): the ranks join their process group, rank 0 makes
    the folder, and the others are told its name."""
    if ranks.distributed:
        import torch
        ranks.start(torch.cuda.is_available())
    return ranks.share(lambda: fresh_out(out, kind, prefix))


def discard_out(out: Path) -> None:
    """Gives back a study's folder that ends holding nothing: removed if the study made it
    (its claim first), else left as it was found."""
    release_claims()  # removes it if this study made it and it is empty


def keep_interrupted(out: Path, exc: BaseException, finished: str, write_partial=None
                     ) -> StudyInterrupted:
    """A study ended by Ctrl-C or SIGTERM. The folder becomes <out>-interrupted if this
    study made it (a --out that existed keeps its name, and may hold another command's
    work: its table says it), or is removed if it holds nothing; then write_partial(folder),
    if given, writes the table of what finished, marked as interrupted (its runs are now
    under `folder`). Returns the error whose message is the one line to print: the
    signal, the step a run was at, and where what finished is (`finished`: '2 of 5 runs
    finished')."""
    made, nothing = is_made_here(out), write_partial is None
    # Before a rename: the claim must not travel with the folder. With nothing to write,
    # a folder this study made that holds nothing goes with it.
    release_claims(folders=nothing)
    cause = interruption(exc).split(";")[0]  # where the run kept its steps is said below
    if nothing and not (out.is_dir() and any(out.iterdir())):
        return StudyInterrupted(f"{cause}; nothing kept")
    if made:
        out = mark(out, "interrupted")
    if write_partial is not None:
        write_partial(out)
    return StudyInterrupted(f"{cause}; kept in {display(out)} ({finished})")


def base_config(train_args: list[str], per_run: tuple[str, ...], refusal: str,
                **implied) -> tuple[train.Config, dict]:
    """The train.py options every run of a study shares, as a Config (`implied` applied
    as if given first), and the options given by field. A field in `per_run` is set by
    the study for each run: given, it would make every run the same one, so it is
    refused with '--<flag> <refusal>'."""
    given = train.given_options(train_args)
    for name in per_run:
        if name in given:
            raise UserError(f"--{name.replace('_', '-')} {refusal}")
    return train.make_config({**implied, **given}), given


def run_config(base: train.Config, **fields) -> train.Config:
    """One run's config: the study's shared options with this run's fields."""
    return dataclasses.replace(base, **fields)


def progress(tag: str, started: float, done: int, total: int) -> str:
    """A study's line as a run starts: '[3/24] padded train (41 s so far; about 5 min left
    at this pace)'; no estimate before a run has finished. make compare gave no idea of
    its whole run's time. The pace is the runs' so far: the loop's take longest."""
    import time
    spent = time.time() - started
    line = f"{tag} ({spent:.0f} s so far"
    if done:
        left = spent / done * (total - done)
        line += (f"; about {left / 60:.0f} min left at this pace" if left >= 90 else
                 f"; about {left:.0f} s left at this pace")
    return line + ")"


def attempt(cfg: train.Config, tag: str) -> tuple[dict | None, str | None]:
    """One train.run in this process: (its summary, None), or (None, why it failed). One
    run's failure is a row of the table, not the end of the study (on one rank)."""
    try:
        # In this process: the model, its compiled form and CUDA's start-up are shared
        # by every run (model/build.py re-initialises the weights for each).
        return train.run(cfg, reuse=True), None
    except Exception as exc:
        if from_env().distributed:
            raise  # the other ranks would wait for this one in the next run's collectives
        cause = exc.__cause__ or exc
        # A user's mistake or a full disk is its line; anything else is a bug to show.
        if not (isinstance(cause, UserError) or is_write_failure(cause)):
            traceback.print_exc()
        print(f"{tag}: failed: {one_line(exc)}", file=sys.stderr, flush=True)
        return None, f"the run failed: {one_line(exc)}"


def outcome(skipped: list[dict], column: str, ran: int, what: str) -> int:
    """A study's exit code: 1, with one line on stderr, when a run failed (its row's
    `column` says so) or none ran; 0 otherwise."""
    failed = [r for r in skipped if str(r.get(column, "")).startswith("the run failed")]
    if failed or not ran:
        print(f"error: {len(failed)} {what} failed, {ran} ran (the rows say why)",
              file=sys.stderr)
        return 1
    return 0


# The host's pace a run (profiling/step_reader.pace): its columns in make throughput's and
# make scaling's tables.
PACE_COLUMNS = ["host ms a step (median / p90 / p99)", "host / step",
                "whole loop ms (median / p90)", "slow steps"]


def pace_cells(summary: dict) -> dict:
    """A run's host time a step (median, p90, p99), its median over the median step, the
    whole loop's time a step (the bookkeeping after the step added, the waits for the GPU
    left out; none where the run read each step at once, or before it was recorded), and
    the steps after the first tenth that took over 1.3x the median; {} where the run
    recorded none (a summary from before they were)."""
    paced = summary.get("pace")
    if not paced:
        return {}
    share, loop = paced["host_share"], paced.get("loop_ms_median")
    return {PACE_COLUMNS[0]: f"{paced['host_ms_median']:.1f} / {paced['host_ms_p90']:.1f} / "
                             f"{paced['host_ms_p99']:.1f}",
            PACE_COLUMNS[1]: None if share is None else f"{share * 100:.0f} %",
            PACE_COLUMNS[2]: None if loop is None else
            f"{loop:.1f} / {paced['loop_ms_p90']:.1f}",
            PACE_COLUMNS[3]: f"{paced['slow_steps']} of {paced['after_first_tenth']}"}
