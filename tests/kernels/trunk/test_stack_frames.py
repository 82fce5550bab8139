"""No trunk kernel keeps a large stack frame on the H100 (sm_90a), read from the cubin
Triton builds, on a machine without a GPU (bench/kernel_stack.py).

Why a CPU test: the CUDA driver reserves a context's local memory for the largest frame
it has launched, for every thread the GPU can hold, and keeps it while the process lives.
The fp32 conv-pool forward once spilled 55,728 bytes a thread, 15 GB of the H100 for any
process that ran it once: make test-gpu's six workers then ran the GPU out of memory."""

import subprocess
import sys

from tests.helpers import REPO

# 8 KB a thread is 2.2 GB of local memory on the H100 (2048 threads x 132 SMs).
MAX_FRAME = 8192
KERNELS = ("_first_block_fwd_kernel", "_first_block_bwd_kernel",
           "_first_block_code_bwd_kernel", "_second_block_fwd_kernel",
           "_second_block_wgrad_kernel", "_second_block_xgrad_kernel", "_conv_pool_fwd_kernel",
           "_conv_pool_xgrad_kernel", "_conv_pool_wgrad_kernel", "_pool_fwd_kernel",
           "_pool_bwd_kernel")


def test_every_trunk_kernel_keeps_its_stack_frame_small_on_the_h100():
    done = subprocess.run([sys.executable, "bench/kernel_stack.py", "--max-frame",
                           str(MAX_FRAME)], cwd=REPO, capture_output=True, text=True,
                          timeout=1800)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [line for line in done.stdout.splitlines() if line.startswith("| ") and
            "_kernel" in line]
    for dtype in ("fp32", "bf16", "fp16"):
        for layout in ("NCHW", "NHWC"):
            seen = {row.split(" | ")[1] for row in rows if f" {dtype} {layout} |" in row}
            # The first block's recomputing backward runs with fp32 outputs only.
            want = {k for k in KERNELS if k != "_first_block_bwd_kernel" or dtype == "fp32"}
            assert seen == want, (dtype, layout, sorted(want - seen))


def test_the_frame_check_fails_over_its_limit():
    """--max-frame below the bf16 input gradient's frame (2,296 bytes in Triton 3.6's
    cubin, 3,488 in 3.9's) fails, in one line."""
    done = subprocess.run([sys.executable, "bench/kernel_stack.py", "--only",
                           "conv_pool bf16 NCHW", "--max-frame", "1024"], cwd=REPO,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 1
    over = [line for line in done.stderr.splitlines() if line.startswith("over 1024 bytes: ")]
    assert len(over) == 1 and "_conv_pool_xgrad_kernel" in over[0], done.stderr[-2000:]
