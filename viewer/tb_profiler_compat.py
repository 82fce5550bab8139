"""Makes torch-tb-profiler 0.4.3 (its last release) read traces of torch 2.x correctly:
launches categorised cuda_runtime and cuda_driver, the GPU-side twins of steps and
collectives, NCCL kernels tied to their collective, and the page served offline.

`apply()` patches the plugin's parser and its page in this process, and selects 'fork'
for the plugin's children so that they inherit the patch. What each change in the traces
broke, and how: docs/design.md, this module's section."""

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
