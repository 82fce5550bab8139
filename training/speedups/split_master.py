"""lin1's fp32 master held as two halves (kernels/lin1/master_halves.py): the bf16 weight
the GEMMs already read is its high half, rounded; a 16-bit low half and a tie bit are the
rest. The shadow SGD then moves 18 bytes an element instead of 20 (2.15 GB less a step
through HBM, ~0.7 ms of the update's 7.2 at 3 TB/s alone) and the master takes 2.3 GB
instead of 4.3.

The maths is --bf16-shadow's, bit for bit: the same fp32 master, the bf16 weight torch's
rounding of it, the same momentum.

    model.lin1.weight         bf16 parameter, the master's high half (unchanged)
    model.lin1_master_low     int16 buffer, the master's low half  } replace
    model.lin1_master_ties    int32 buffer, a tie bit an element   } lin1_master

The optimizer (training/shadow_optimizer.py) holds the two as its state; the kernel reads
the master's form from its dtype.
"""

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
