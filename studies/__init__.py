"""The commands that make many runs and compare them: make compare (compare.py), make
ladder (ladder.py), make sweep (sweep.py). They sit above train.py: they build each run's
Config and call train.run; nothing below imports them."""
