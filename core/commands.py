"""A command's main() and its exit: its errors as one line and an exit code, the output
folders it took given back, Ctrl-C and SIGTERM as one line saying what was not written.

    main = command(_main)                                     # main(argv) -> exit code
    run_command(main, "the ladder was not written")           # in `if __name__ == ...`
"""

import sys

from core.errors import StudyInterrupted, exit_code, print_error, report_errors
from core.files import release_claims
from core.output import survive_closed_stdout
from core.signals import ignore_stop_signals, stop_once, stop_signal


def command(body):
    """A command's main(argv=None) -> exit code: its body, whose ProjectErrors become
    their line and code (report_errors); the folders it took are given back when it ends."""
    def main(argv=None) -> int:
        try:
            return report_errors(body, argv)
        finally:
            release_claims()
    main.__doc__ = body.__doc__
    return main


def run_command(main, unwritten: str, stop_signals: bool = True) -> None:
    """Runs a command's main() and exits with its code; Ctrl-C or SIGTERM (as a
    KeyboardInterrupt, once: core.signals.stop_once, unless stop_signals is False for a
    command that handles them itself) is one line saying what was not written, and exit
    130 (the run in progress has already marked its own folder)."""
    survive_closed_stdout()  # `| head` ends no run (core/output.py)
    if stop_signals:
        stop_once()
    try:
        code = main()
    except KeyboardInterrupt as exc:
        print_error(str(exc) if isinstance(exc, StudyInterrupted)
                    else f"{str(exc) or 'interrupted'}; {unwritten}")
        code = exit_code(exc)
    if code == 0 and stop_signal():
        # The signal's KeyboardInterrupt was swallowed on the way (make ladder SIGTERMed
        # as it wrote its tables exited 0, with no word of it): never 0 after one.
        print_error(f"interrupted ({stop_signal()}) as the command ended; what it said it "
                    "wrote is whole")
        code = 130
    leave(code)


_LEAVING: dict[str, int] = {}


def leave(code: int) -> None:
    """sys.exit(code), the code noted first: an exit hook that must end the process
    itself, skipping the interpreter's shutdown (training/ranks.py's, whose process group
    cannot be freed), exits with the command's own code. Ctrl-C and SIGTERM are ignored
    from here on: the command has its code and is leaving. torchrun stops every rank with
    SIGTERM once one has failed, and one that reached a rank in the interpreter's exit
    callbacks (torch.library's finalizers) raised stop_once's KeyboardInterrupt there:
    an "Exception ignored in atexit callback" traceback under the one-line error. Ignored,
    not handled: the interpreter resets a Python handler to the default action as it
    shuts down (a later signal then killed the process), never an ignored signal."""
    _LEAVING["code"] = code
    ignore_stop_signals()
    sys.exit(code)


def leaving_code() -> int:
    """The code the command is leaving with; 1 where it left another way."""
    return _LEAVING.get("code", 1)
