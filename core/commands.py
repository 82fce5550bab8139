"""A command's main() and its exit: its errors as one line and an exit code, the output
folders it took given back, Ctrl-C and SIGTERM as one line saying what was not written.

    main = command(_main)                                     # main(argv) -> exit code
    run_command(main, "the ladder was not written")           # in `if __name__ == ...`
"""

import atexit
import os
import sys

from core.errors import (
    StudyInterrupted,
    exit_code,
    interruption,
    print_error,
    report_errors,
)
from core.files import release_claims
from core.gc_pause import imports_done, pause_while_importing
from core.output import survive_closed_stdout
from core.signals import (
    note_stop_signals,
    raise_if_stopped,
    stop_once,
    stop_signal,
)


def program_starts() -> None:
    """Called by a program before its other imports (torch's take seconds): a Ctrl-C or
    SIGTERM meanwhile is noted, and the command ends on it at its start (130, one line;
    run_command), not by the signal or a KeyboardInterrupt's traceback. The garbage
    collector is paused until the imports are done (core/gc_pause.py says why). Importing
    this module registers its exit callback first, so that it runs last."""
    note_stop_signals()
    pause_while_importing()


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
    imports_done()  # the collector paused at the program's start resumes
    survive_closed_stdout()  # `| head` ends no run (core/output.py)
    if stop_signals:
        stop_once()
    try:
        raise_if_stopped()  # one noted as the program started (its imports: studies/)
        code = main()
    except KeyboardInterrupt as exc:
        print_error(str(exc) if isinstance(exc, StudyInterrupted)
                    else f"{interruption(exc)}; {unwritten}")
        code = exit_code(exc)
    leave(code)


_LEAVING: dict[str, int] = {}


def leave(code: int) -> None:
    """sys.exit(code), the code noted first: an exit hook that must end the process
    itself, skipping the interpreter's shutdown (training/ranks.py's, whose process group
    cannot be freed), exits with the command's own code.

    Never 0 after a Ctrl-C or SIGTERM: one whose KeyboardInterrupt was swallowed on the
    way (make ladder SIGTERMed as it wrote its tables exited 0, with no word of it), or
    one that arrives from here on, while the exit callbacks run. Those are noted, not
    raised: torchrun stops every rank with SIGTERM once one has failed, and one that
    reached a rank in the interpreter's exit callbacks (torch.library's finalizers) raised
    a KeyboardInterrupt there, an "Exception ignored in atexit callback" traceback under
    the one-line error; _after_the_exit_callbacks acts on it."""
    note_stop_signals()
    if code == 0 and stop_signal():
        code = _interrupted_as_it_ended()
    _LEAVING["code"] = code
    sys.exit(code)


def _interrupted_as_it_ended() -> int:
    print_error(f"interrupted ({stop_signal()}) as the command ended; what it said it "
                "wrote is whole")
    return 130


@atexit.register  # as this module is imported: after the exit callbacks of those that follow
def _after_the_exit_callbacks() -> None:
    """The end of a command that left through leave(): a stop signal noted while a command
    that ended well was leaving turns its 0 into 130, with its line. Then the process ends
    here, its streams flushed: the interpreter's own shutdown (0.8 s of freeing torch's
    modules after a CPU run) had to run with the stop signals ignored (it resets a Python
    handler to the default action: a death by the signal), and a SIGTERM that came then
    was lost: the run exited 0."""
    code = _LEAVING.get("code")
    if code is None:  # not a command's exit (a test importing this module)
        return
    logging = sys.modules.get("logging")
    if logging is not None:
        logging.shutdown()
    _flush()
    if code == 0 and stop_signal():  # last, just before the end: no window after it
        code = _interrupted_as_it_ended()
        _flush()
    os._exit(code)


def _flush() -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a closed pipe (`| head`): nothing more to say
            pass


def leaving_code() -> int:
    """The code the command is leaving with; 1 where it left another way."""
    return _LEAVING.get("code", 1)
