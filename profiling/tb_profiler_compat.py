"""Makes torch-tb-profiler 0.4.3 (its last release) read traces of torch 2.x correctly.

Two changes in the traces since 0.4.3, each found on a torch 2.11 GPU trace of this repo
(tests/fixtures/gpu_*_train.pt.trace.json.gz):

1. Kernel launches are categorised `cuda_runtime` (and `cuda_driver` for Triton's
   cuLaunchKernelEx); 0.4.3 knows only `Runtime`. Unknown events are dropped, so no kernel
   is linked to the operator that launched it: device time 0 for every operator, every
   kernel attributed to "CallTreeRoot", 0 us of runtime in the Overview.
2. Each `ProfilerStep#N` also appears as a GPU-side `gpu_user_annotation` twin. 0.4.3
   maps that category to user annotations and takes the twin for another step. Once the
   launches are known (1), step times are matched to device work and the twin becomes a
   step with no cost: the Overview then divides by its zero total (ZeroDivisionError).
   Only the host-side ProfilerStep ranges are steps.

`apply()` patches the plugin's parser in this process. The plugin parses each trace in
a child process, started with 'spawn' by default, which would re-import the unpatched
module; `apply()` therefore selects 'fork' through the plugin's own switch
(TORCH_PROFILER_START_METHOD), so the children inherit the patch. CPU traces have neither
category nor twins and parse as before.
"""

import os

RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")


def apply() -> None:
    os.environ["TORCH_PROFILER_START_METHOD"] = "fork"
    from torch_tb_profiler.profiler import event_parser, trace

    for category in RUNTIME_CATEGORIES:
        trace.EventTypeMap[category] = trace.EventTypes.RUNTIME
    if getattr(trace.create_trace_event, "_ragged_compat", False):
        return
    original = trace.create_trace_event

    def create_trace_event(event, is_pytorch_lightning):
        if event.get("cat") == "gpu_user_annotation" and \
                str(event.get("name", "")).startswith("ProfilerStep#"):
            return None  # the GPU-side twin of a step, not a step
        return original(event, is_pytorch_lightning)

    create_trace_event._ragged_compat = True
    trace.create_trace_event = create_trace_event
    # event_parser imported the function by name; point it at the patched one too.
    if getattr(event_parser, "create_trace_event", None) is original:
        event_parser.create_trace_event = create_trace_event
