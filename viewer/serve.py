"""TensorBoard with the profiler plugin, made right for torch 2.x traces (make tensorboard).

    python3 -m viewer.serve --logdir profiles --port 6006

Arguments go to TensorBoard unchanged; it binds to localhost unless told otherwise.
"""

import sys

from core.errors import UserError, command
from viewer import tb_profiler_compat


def _main(argv) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
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
