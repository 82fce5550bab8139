"""The bottom layer: names, GIoU rules and input checks that data/, losses/, kernels/,
profiling/ and train.py all use. It imports nothing of the project's own."""
