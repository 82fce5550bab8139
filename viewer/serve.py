"""TensorBoard with the profiler plugin, made right for torch 2.x traces (make tensorboard).

    python3 -m viewer.serve --logdir profiles --port 6006

Arguments go to TensorBoard unchanged; it binds to localhost unless told otherwise.
"""

import sys
from pathlib import Path

from core.errors import UserError, command
from viewer import tb_profiler_compat


def _logdirs(argv: list[str]) -> list[str]:
    """The --logdir values (--logdir X or --logdir=X)."""
    found = [argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--logdir"]
    return found + [a.split("=", 1)[1] for a in argv if a.startswith("--logdir=")]


def _main(argv) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    for logdir in _logdirs(argv):
        # TensorBoard serves an empty page for a folder that does not exist, and says
        # nothing; a local one is checked here (a URL such as gs:// is left to it).
        if "://" not in logdir and not Path(logdir).is_dir():
            raise UserError(f"no folder {logdir}: make profile writes its runs into "
                            "profiles/ (LOGDIR= picks another folder)")
    try:
        import torch_tb_profiler  # noqa: F401
        from tensorboard import main as tensorboard_main
    except ImportError as exc:
        raise UserError(f"{exc.name} is not installed: pip install torch-tb-profiler==0.4.3 "
                        "(make setup does it on a CPU machine)") from exc
    tb_profiler_compat.apply()
    if not any(a == "--host" or a.startswith("--host=") or a.startswith("--bind_all")
               for a in argv):
        argv += ["--host", "127.0.0.1"]
    sys.argv = ["tensorboard", *argv]
    return tensorboard_main.run_main() or 0


main = command(_main)


if __name__ == "__main__":
    sys.exit(main())
