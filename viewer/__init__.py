"""TensorBoard with the profiler plugin, made right for torch 2.x traces (make tensorboard):
serve.py starts it, tb_profiler_compat.py patches the plugin. Above profiling/ (it reads
communication's definitions), beside the studies: nothing imports it."""
