"""The commands that make many runs and compare them: make compare (compare.py), make
ladder (ladder.py), make sweep (sweep.py). They sit above train.py: they build each run's
Config and call train.run; nothing below imports them."""

import sys

# Run as `python3 -m studies.<command>` (sys.argv[0] is "-m" while the module is
# found): a Ctrl-C or SIGTERM during the imports (torch's take seconds) is noted, and the
# command ends on it at its start (130, one line; core/commands.run_command), not by the
# signal or a traceback.
if sys.argv[:1] == ["-m"]:
    import core.commands  # noqa: F401  its exit callback registered first, so run last
    from core.signals import note_stop_signals
    note_stop_signals()
