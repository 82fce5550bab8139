"""stdout that a closed pipe cannot break: `make throughput | head -6` closes the pipe
after six lines, and the next print raised BrokenPipeError in the middle of a run, which
then ended as failed, as if by a bug, with two tracebacks. A reader that goes
away is the user's choice, like Ctrl-C; here it is a quieter one: the lines after it go
nowhere and the runs go on to their end, their folders whole.

    survive_closed_stdout()   every command calls it first (core.commands.run_command,
                              train.main)
"""

import os
import sys


class _Survivor:
    """sys.stdout's stand-in: writes through until the reader has gone, then to
    /dev/null (file descriptor 1 too, so that the interpreter's last flush and any child
    process find it open)."""

    def __init__(self, stream):
        self._stream = stream

    def _gone(self) -> None:
        null = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(null, self._stream.fileno())
        except (OSError, ValueError):
            pass
        finally:
            os.close(null)
        self._stream = open(os.devnull, "w")

    def write(self, text: str) -> int:
        try:
            return self._stream.write(text)
        except BrokenPipeError:
            self._gone()
            return len(text)

    def flush(self) -> None:
        try:
            self._stream.flush()
        except BrokenPipeError:
            self._gone()

    def __getattr__(self, name):
        return getattr(self._stream, name)


def survive_closed_stdout() -> None:
    if not isinstance(sys.stdout, _Survivor):
        sys.stdout = _Survivor(sys.stdout)
