"""--float8-lin1's weight cast (kernels/lin1/float8_cast.py) over tile shapes and warps at
the GPU preset's weight (16384 x 65536 bf16): GPU ms each (CUDA events, the median of 20
calls after 3 warm-ups), and whether each wrote the same bytes as the kernel's own
shape. Its floor: 4.3 GB through HBM (the weight read, both copies written).

Run on the device: python3 bench/float8_cast_tiles.py
"""

import argparse
import sys

import torch

sys.path.insert(0, ".")
from bench.needs_gpu import require_cuda  # noqa: E402
from bench.sharded_rank import cuda_ms  # noqa: E402
from kernels.lin1 import float8_cast as fc  # noqa: E402

ROWS, COLS = 16384, 65536
SHAPES = ((64, 64, 4), (128, 128, 8), (64, 128, 4), (128, 64, 4), (64, 256, 8),
          (256, 64, 8), (128, 128, 4), (32, 256, 4))


def launch(w, w8, w8t, state, rows: int, cols: int, warps: int) -> None:
    """The cast kernel alone (no roll: the scale stays, so every call writes the same)."""
    grid = (ROWS // rows, COLS // cols)
    fc._cast_kernel[grid](w, w8, w8t, state, ROWS, COLS, E4M3_MAX_=fc.E4M3_MAX,
                          SLOTS_=fc.SLOTS, BR=rows, BC=cols, num_warps=warps)


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    require_cuda("it times a Triton kernel on the device")
    w = (torch.randn(ROWS, COLS, device="cuda") / 256).bfloat16()
    fp8 = dict(dtype=torch.float8_e4m3fn, device="cuda")
    ref8, ref8t = torch.empty(ROWS, COLS, **fp8), torch.empty(COLS, ROWS, **fp8)
    state, inverse = fc.new_state(w)
    fc.cast_weight(w, ref8, ref8t, state, inverse)  # the kernel's own shape, and its scale
    w8, w8t = torch.empty_like(ref8), torch.empty_like(ref8t)
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}; the kernel's own "
          f"shape {fc.BLOCK_ROWS} x {fc.BLOCK_COLS}, {fc.NUM_WARPS} warps; "
          f"{ROWS * COLS * 4 / 1e9:.2f} GB a cast\n")
    print("| tile | warps | GPU ms | same bytes |\n|---|---:|---:|---|")
    for rows, cols, warps in SHAPES:
        ms = cuda_ms(lambda: launch(w, w8, w8t, state, rows, cols, warps))
        same = torch.equal(w8.view(torch.uint8), ref8.view(torch.uint8)) and \
            torch.equal(w8t.view(torch.uint8), ref8t.view(torch.uint8))  # host-device sync
        print(f"| {rows} x {cols} | {warps} | {ms:.3f} | {'yes' if same else 'NO'} |")


if __name__ == "__main__":
    main()
