"""stdout that a closed pipe cannot break (`make throughput | head -6`): the lines after it
go nowhere and the runs go on to their end, where a BrokenPipeError failed them as if by
a bug. The design in full: docs/design.md, this module's section."""

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
