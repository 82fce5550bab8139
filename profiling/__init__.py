"""What one run needs around its loop (run folder, profiler, each step's loss and device
time, summary, early ends) and what turns its trace into numbers. Nothing here imports
train.py or the studies above it."""
