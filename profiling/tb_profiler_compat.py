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

3. The plugin's page draws its charts with Google Charts, loaded from the internet. A
   browser that cannot reach it stopped at "google is not defined" and showed a spinner
   for ever. The page is now served with a stand-in that lets everything but the charts
   render, and a banner that says why the charts are missing.

`apply()` patches the plugin's parser and its page in this process. The plugin parses each trace in
a child process, started with 'spawn' by default, which would re-import the unpatched
module; `apply()` therefore selects 'fork' through the plugin's own switch
(TORCH_PROFILER_START_METHOD), so the children inherit the patch. CPU traces have neither
category nor twins and parse as before.
"""

import json
import os

RUNTIME_CATEGORIES = ("cuda_runtime", "cuda_driver")


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


def apply() -> None:
    os.environ["TORCH_PROFILER_START_METHOD"] = "fork"
    from torch_tb_profiler.profiler import event_parser, trace

    _patch_page()

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
