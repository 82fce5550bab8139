"""TensorBoard with the profiler plugin, made right for torch 2.x traces (make tensorboard).

    python3 -m viewer.serve --logdir profiles --port 6006

Arguments go to TensorBoard unchanged; it binds to localhost unless told otherwise.
"""

import os
import sys
from pathlib import Path

from core.commands import command
from core.errors import UserError
from viewer import tb_profiler_compat


def _logdirs(argv: list[str]) -> list[str]:
    """The --logdir values (--logdir X or --logdir=X)."""
    found = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--logdir"]
    return found + [a.split("=", 1)[1] for a in argv if a.startswith("--logdir=")]


# Set once the server stops: a child forked after that exits at once (the plugin's loading
# threads go on forking trace loaders, which the atexit handlers would then wait for).
_STOPPING: list[bool] = []
# The server's pid, set as its handlers go in: a forked child inherits them.
_SERVER: list[int] = []


def _children_go_with_the_server() -> None:
    """Every process the server forks (the plugin's cache Manager, one loader per trace)
    ignores Ctrl-C and SIGTERM and is SIGKILLed when the server dies (Linux's
    PR_SET_PDEATHSIG). A Ctrl-C to the terminal's group reached them all: the Manager died
    first, each loader printed its traceback of the lost connection (44 for 48 runs), and
    some ran on for a minute after the prompt came back. Now the server alone
    takes the signal and its children end with it, silently. (TensorBoard's data server is
    exec'd with --die-after-stdin: it ends with the server too.)"""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import os
    import signal

    server = os.getpid()

    def in_child() -> None:
        if _STOPPING:  # forked by a loading thread while the server stops: not wanted
            os._exit(0)
        for signum in (signal.SIGINT, signal.SIGTERM):
            signal.signal(signum, signal.SIG_IGN)
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
        if os.getppid() != server:  # the server died before the line above
            os._exit(0)

    os.register_at_fork(after_in_child=in_child)


TRACE_SUFFIXES = (".pt.trace.json", ".pt.trace.json.gz")


def trace_fault(path: Path) -> str | None:
    """Why the profiler plugin could not read the trace at path (empty, truncated, not
    gzip, not text, not a JSON object), or None. Read to its end, not parsed: the first
    and last bytes that are not blank must be '{' and '}'. The plugin met such a file in
    a forked loader and printed its traceback among the server's lines."""
    import gzip
    import zlib
    first = last = b""
    try:
        with (gzip.open if path.name.endswith(".gz") else open)(path, "rb") as f:
            while chunk := f.read(1 << 20):
                text = chunk.strip()
                if text:
                    first, last = first or text[:1], text[-1:]
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        return f"not a whole gzip file ({exc}: truncated?)"
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not first:
        return "it is empty"
    if (first, last) != (b"{", b"}"):
        return "not a JSON object (truncated, or not a trace)"
    return None


def _check_traces(logdir: Path) -> None:
    """Every trace under logdir readable, or one line naming the first that is not."""
    for path in sorted(logdir.rglob("*.pt.trace.json*")):
        if path.name.endswith(TRACE_SUFFIXES) and (why := trace_fault(path)):
            raise UserError(f"{path}: {why}; TensorBoard cannot show it (remove it, or "
                            "its run, from the folder)")


def _check_port(argv: list[str]) -> None:
    """--port as a number of 0..65535 (0: any free one), one line otherwise (TensorBoard
    printed its usage, 20 lines, for `make tensorboard PORT=abc`)."""
    ports = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--port"]
    for port in ports + [a.split("=", 1)[1] for a in argv if a.startswith("--port=")]:
        if not (port.isdigit() and int(port) < 65536):
            raise UserError(f"port {port!r} is not a port number: give 0..65535, 0 for any "
                            "free one (make tensorboard PORT=6006)")


def _address(argv: list[str]) -> str | None:
    """http://host:port of the server, where the arguments fix both (not port 0, any free
    one, nor --bind_all)."""
    def value(flag: str, default: str | None) -> str | None:
        for i, a in enumerate(argv):
            if a == flag and i + 1 < len(argv):
                return argv[i + 1]
            if a.startswith(flag + "="):
                return a.split("=", 1)[1]
        return default
    host, port = value("--host", None), value("--port", "6006")
    if host is None or port == "0":
        return None
    return f"http://{host}:{port}"


def _main(argv) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    _check_port(argv)
    for logdir in _logdirs(argv):
        # TensorBoard serves an empty page for a folder that does not exist, and says
        # nothing; a local one is checked here (a URL such as gs:// is left to it).
        if "://" not in logdir and not Path(logdir).is_dir():
            raise UserError(f"no folder {logdir}: make profile writes its runs into "
                            "profiles/ (LOGDIR= picks another folder)")
        if "://" not in logdir:
            _check_traces(Path(logdir))
    # The plugin logs every trace it loads at INFO: the URL TensorBoard prints came as line
    # 44 of 46. Its warnings stay; TORCH_PROFILER_LOG_LEVEL=INFO brings the rest back.
    os.environ.setdefault("TORCH_PROFILER_LOG_LEVEL", "WARNING")
    try:
        import torch_tb_profiler  # noqa: F401
        from tensorboard import main as tensorboard_main
    except ImportError as exc:
        raise UserError(f"{exc.name} is not installed: pip install torch-tb-profiler==0.4.3 "
                        "(make setup does it on a CPU machine)") from exc
    tb_profiler_compat.apply()
    _children_go_with_the_server()
    if not any(a == "--host" or a.startswith("--host=") or a.startswith("--bind_all")
               for a in argv):
        argv += ["--host", "127.0.0.1"]
    address = _address(argv)
    if address:  # first, above TensorBoard's notes (the URL came as line 44 of 46)
        print(f"make tensorboard: open {address}/#pytorch_profiler (Ctrl-C stops it)",
              flush=True)
    sys.argv = ["tensorboard", *argv]
    import signal

    from tensorboard import program

    # Ctrl-C and SIGTERM stop the server in handlers of its own. Python's KeyboardInterrupt
    # is not enough: a process started in the background by a non-interactive shell
    # inherits SIGINT ignored, and Python then keeps it ignored (a CI run started so saw
    # the server serve on, its SigIgn holding SIGINT, 24 minutes after the test's
    # Ctrl-C). TensorBoard's own SIGTERM handler (the method its embedders override) ran
    # its atexit handlers instead: the plugin's Manager went first, each trace loader
    # printed the lost connection, and the threads were joined for 15 s.
    _SERVER.append(os.getpid())
    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, _stop)
    program.TensorBoard._install_signal_handler = (
        lambda self, signum, name: signal.signal(signum, _stop))
    try:
        return tensorboard_main.run_main() or 0
    except KeyboardInterrupt:
        _stop()


def _stop(signum=None, frame=None) -> None:
    """Ends the server now, and its children with it: TensorBoard's and the plugin's
    threads are not daemons, and the interpreter joined them for 5-15 s. A server has
    nothing to write; should the cleanup hang, a timer ends the server 5 s on."""
    import os
    import threading
    if _SERVER and os.getpid() != _SERVER[0]:
        # A child forked by a loading thread, the signal come before its fork hook
        # ignored it: the hooks of threading run first, and a CI run saw this child join
        # the server's children ("can only join a child process", a traceback). The
        # server ends it anyway; it goes now, silently.
        os._exit(0)
    if _STOPPING:  # a second signal while the first's cleanup runs
        return
    _STOPPING.append(True)
    threading.Timer(5.0, os._exit, args=(130,)).start()
    _end_children()
    print("make tensorboard: stopped", file=sys.stderr, flush=True)
    os._exit(130)


def _end_children() -> None:
    """The trace loaders killed (nothing of theirs is kept), then the plugin's Manager shut
    down by its own message (it removes its socket's pymp-* folder, which a killed one
    left), then the atexit handlers (the plugin's cache folder): no temporary folder
    stays, and no loader outlives its Manager to print a lost connection."""
    import atexit
    import gc
    import multiprocessing
    from multiprocessing.managers import BaseManager
    managers = [o for o in gc.get_objects() if isinstance(o, BaseManager)]
    theirs = {getattr(m, "_process", None) for m in managers}
    for child in multiprocessing.active_children():
        if child not in theirs:
            child.kill()
            child.join(timeout=2)
    for manager in managers:
        try:
            manager.shutdown()
        except Exception:  # noqa: BLE001 (not started, or already gone)
            pass
    atexit._run_exitfuncs()


main = command(_main)


if __name__ == "__main__":
    sys.exit(main())
