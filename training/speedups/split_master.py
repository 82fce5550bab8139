"""lin1's fp32 master held as two halves (kernels/lin1/master_halves.py): the bf16 weight the
GEMMs already read is its high half, rounded; an int16 low half and a tie bit are the rest.
The shadow SGD then moves 18 bytes an element instead of 20 (2.15 GB less a step), and the
master takes 2.3 GB instead of 4.3; the maths is --bf16-shadow's bit for bit. The design
in full: docs/design.md, this module's section."""

from training.speedups.base import SpeedUp


def split_master(model, build) -> None:
    from kernels.lin1.master_halves import low_half
    from training.parallel import MASTER, MASTER_LOW, MASTER_TIES
    if not hasattr(model, MASTER):
        return  # --bf16-shadow off: no master (idle says so)
    # The high half is the parameter: bf16_shadow made it the master's rounding.
    low, ties = low_half(getattr(model, MASTER), model.lin1.weight.data)
    delattr(model, MASTER)  # its 4.3 GB freed here
    model.register_buffer(MASTER_LOW, low)
    model.register_buffer(MASTER_TIES, ties)


SPEEDUP = SpeedUp(
    "split_master",
    "lin1's fp32 master held as its bf16 weight plus a 16-bit low half: the shadow SGD "
    "moves 18 bytes an element, not 20 (GPU, with --bf16-shadow)",
    gpu_only=True, model=split_master,
    idle=lambda asked, on: None if on["bf16_shadow"] else
    "it holds --bf16-shadow's master, which is off")
