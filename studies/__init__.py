"""The commands that make many runs and compare them: make compare (compare.py), make
ladder (ladder.py), make sweep (sweep.py). They sit above train.py: they build each run's
Config and call train.run; nothing below imports them."""

import sys

# Run as `python3 -m studies.<command>` (sys.argv[0] is "-m" while the module is found).
if sys.argv[:1] == ["-m"]:
    from core.commands import program_starts
    program_starts()
