"""The one exception type for mistakes a user can make (bad option, bad data, no GPU).

train.py prints such an error as one line and exits 2; everything else is a bug and keeps
its traceback.
"""


class UserError(Exception):
    """A mistake the user can fix; the message says how."""


def one_line(exc: BaseException) -> str:
    """The message of a UserError, also when a DataLoader worker re-raised it.

    A worker's exception comes back with its traceback folded into the message; the user
    needs only its last line, without the 'errors.UserError: ' prefix.
    """
    text = str(exc).strip()
    last = text.splitlines()[-1] if text else type(exc).__name__
    prefix = "UserError: "
    return last.split(prefix, 1)[1] if prefix in last else last


def exit_with(main, unwritten: str) -> None:
    """Runs a command's main() and exits with its code; Ctrl-C is one line and exit 130
    (the run in progress already marked its own folder). make compare and make ladder."""
    import sys
    try:
        sys.exit(main())
    except KeyboardInterrupt as exc:
        print(f"error: {str(exc) or 'interrupted'}; {unwritten}", file=sys.stderr)
        sys.exit(130)
