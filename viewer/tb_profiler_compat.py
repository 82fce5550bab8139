"""Makes torch-tb-profiler 0.4.3 (its last release) read traces of torch 2.x correctly.

What changed in the traces since 0.4.3, and what each change broke (seen on this repo's
torch 2.11 GPU traces, tests/fixtures/gpu_*.pt.trace.json.gz):

Steps and operators (single-GPU runs):
a. Kernel launches are categorised `cuda_runtime` (and `cuda_driver` for Triton's
   cuLaunchKernelEx); 0.4.3 knows only `Runtime`. Unknown events are dropped, so no kernel
   is linked to the operator that launched it: device time 0 for every operator, every
   kernel attributed to "CallTreeRoot", 0 us of runtime in the Overview.
b. Each `ProfilerStep#N` also appears as a GPU-side `gpu_user_annotation` twin. 0.4.3
   maps that category to user annotations and takes the twin for another step. Once the
   launches are known (a), step times are matched to device work and the twin becomes a
   step with no cost: the Overview then divides by its zero total (ZeroDivisionError).
   Only the host-side ProfilerStep ranges are steps.

Collectives (the Distributed view of runs on several GPUs, gpu_ddp_rank*):
c. A collective's host op `nccl:all_reduce` has its own External id, but the NCCL kernel
   carries the id of the op around it (`record_param_comms`: pytorch/kineto issue 782).
   0.4.3 ties kernels to collectives by External id, so no kernel was tied: the view's
   communication read 0 and every NCCL kernel counted as computation (its overlap with
   itself). Each NCCL kernel, and the runtime call that launched it, now carry the id of
   the collective op that encloses the launch on the launching thread.
d. Each collective also has a GPU-side `gpu_user_annotation` twin with the op's name,
   which 0.4.3 took for a second collective (and its GPU span for host time). Only the
   host-side ops are collectives, as only the host-side ProfilerStep ranges are steps (b).

The page, offline:
e. The plugin's page draws its charts with Google Charts, loaded from the internet. A
   browser that cannot reach it stopped at "google is not defined" and showed a spinner
   for ever. The page is now served with a stand-in that lets everything but the charts
   render, and a banner that says why the charts are missing.

`apply()` patches the plugin's parser and its page in this process. The plugin parses each
trace in a child process, started with 'spawn' by default, which would re-import the
unpatched module; `apply()` therefore selects 'fork' through the plugin's own switch
(TORCH_PROFILER_START_METHOD), so the children inherit the patch. CPU traces have neither
category nor twins and parse as before.
"""

import json
import os
import time

from profiling.communication import is_collective_kernel

RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")
# The collectives 0.4.3 knows (its trace.NcclOpNameSet and GlooOpNameSet).
COLLECTIVE_OPS = tuple(f"{lib}:{op}" for lib in ("nccl", "gloo") for op in
                       ("broadcast", "reduce", "all_reduce", "all_gather", "reduce_scatter"))


def tie_collective_kernels(events) -> int:
    """Gives each NCCL kernel, and its launching runtime call, the External id of the
    collective op that encloses the launch on the launching thread (c). events are the
    plugin's parsed events; returns how many kernels were tied."""
    from torch_tb_profiler.profiler.trace import EventTypes

    ops_by_thread = {}
    runtime_by_corr = {}
    kernels = []
    for e in events:
        if e.type == EventTypes.RUNTIME:
            runtime_by_corr[e.correlation_id] = e
        elif e.type == EventTypes.KERNEL and is_collective_kernel(str(e.name)):
            kernels.append(e)
        elif e.name in COLLECTIVE_OPS and getattr(e, "duration", None) is not None:
            ops_by_thread.setdefault(e.tid, []).append(e)
    tied = 0
    for kernel in kernels:
        launch = runtime_by_corr.get(kernel.correlation_id)
        if launch is None:
            continue
        for op in ops_by_thread.get(launch.tid, ()):
            if op.ts <= launch.ts <= op.ts + op.duration:
                kernel.external_id = launch.external_id = op.external_id
                tied += 1
                break
    return tied


def _patch_collectives(parser_cls) -> None:
    original = parser_cls.parse
    if getattr(original, "_ragged_compat", False):
        return

    def parse(self, events, fwd_bwd_map):
        tie_collective_kernels(events)
        return original(self, events, fwd_bwd_map)

    parse._ragged_compat = True
    parser_cls.parse = parse


# Injected right after the page's Google Charts loader: when that did not load, an inert
# `google` object lets the page's code run (charts stay empty, every table and text is
# real) and a banner says why.
OFFLINE_CHARTS_NOTE = ("Charts unavailable: this page draws them with Google Charts, "
                       "loaded from the internet, which this browser cannot reach. "
                       "Tables, the trace view and the memory view work without it.")
OFFLINE_CHARTS_SCRIPT = """<script>
(() => {
  if (window.google && window.google.charts) return;
  const handler = {
    get(target, prop) {
      if (prop === Symbol.toPrimitive) return () => 0;
      if (prop === 'then') return undefined;
      return inert;
    },
    apply() { return inert; },
    construct() { return inert; },
  };
  const inert = new Proxy(function () {}, handler);
  window.google = {charts: {load() {}, setOnLoadCallback(cb) { setTimeout(cb, 0); }},
                   visualization: inert};
  document.addEventListener('DOMContentLoaded', () => {
    const note = document.createElement('div');
    note.id = 'offline-charts-note';
    note.textContent = %s;
    note.style.cssText = 'padding:6px 12px;background:#fff3cd;color:#664d03;' +
                         'font:13px sans-serif;border-bottom:1px solid #ffe69c';
    document.body.prepend(note);
  });
})();
</script>"""
LOADER_TAG = b'<script src="https://www.gstatic.com/charts/loader.js"></script>'


def index_html(original: bytes) -> bytes:
    """The plugin's page with the offline stand-in after its Charts loader."""
    script = (OFFLINE_CHARTS_SCRIPT % json.dumps(OFFLINE_CHARTS_NOTE)).encode()
    if LOADER_TAG not in original:
        return original  # a page this patch does not know: served as it is
    return original.replace(LOADER_TAG, LOADER_TAG + script, 1)


def _patch_page() -> None:
    from torch_tb_profiler import plugin
    cls = plugin.TorchProfilerPlugin
    if getattr(cls.static_file_route, "_ragged_compat", False):
        return
    original = cls.static_file_route

    def static_file_route(self, environ, start_response):
        if environ.get("PATH_INFO", "").endswith("/index.html"):
            import werkzeug
            page = os.path.join(os.path.dirname(plugin.__file__), "static", "index.html")
            with open(page, "rb") as f:
                body = index_html(f.read())
            response = werkzeug.Response(body, content_type="text/html",
                                         headers=plugin.TorchProfilerPlugin.headers)
            return response(environ, start_response)
        return original(self, environ, start_response)

    static_file_route._ragged_compat = True
    cls.static_file_route = static_file_route


def _reap_loaders(every_s: float = 2.0) -> None:
    """The plugin forks a process per trace it loads and never waits for them
    (RunLoader.load: 'no need to join'): multiprocessing waits for finished ones only
    when it starts the next, so the last of each load stayed a zombie for the server's
    life (17 after ~30 runs). A daemon thread waits for the finished ones."""
    import multiprocessing
    import threading

    def reap():
        while True:
            multiprocessing.active_children()  # waits for those that have ended
            time.sleep(every_s)

    threading.Thread(target=reap, name="reap-trace-loaders", daemon=True).start()


def apply() -> None:
    os.environ["TORCH_PROFILER_START_METHOD"] = "fork"
    from torch_tb_profiler.profiler import event_parser, trace

    _patch_page()
    if not getattr(apply, "_reaping", False):
        _reap_loaders()
        apply._reaping = True

    for category in RUNTIME_CATEGORIES:
        trace.EventTypeMap[category] = trace.EventTypes.RUNTIME
    if getattr(trace.create_trace_event, "_ragged_compat", False):
        return
    original = trace.create_trace_event

    def create_trace_event(event, is_pytorch_lightning):
        if event.get("cat") == "gpu_user_annotation":
            name = str(event.get("name", ""))
            if name.startswith("ProfilerStep#") or name in COLLECTIVE_OPS:
                return None  # the GPU-side twin of a step or collective (2, 5)
        return original(event, is_pytorch_lightning)

    create_trace_event._ragged_compat = True
    trace.create_trace_event = create_trace_event
    _patch_collectives(event_parser.EventParser)
    # event_parser imported the function by name; point it at the patched one too.
    if getattr(event_parser, "create_trace_event", None) is original:
        event_parser.create_trace_event = create_trace_event
