"""No trunk kernel keeps a large stack frame on the H100 (sm_90a), read from the cubin
Triton builds, on a machine without a GPU (bench/kernel_stack.py).

Why a CPU test: the CUDA driver reserves a context's local memory for the largest frame
it has launched, for every thread the GPU can hold, and keeps it while the process lives.
The fp32 conv-pool forward once spilled 55,728 bytes a thread, 15 GB of the H100 for any
process that ran it once: make test-gpu's six workers then ran the GPU out of memory."""

import os
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


def _table(*flags: str) -> dict[str, list[str]]:
    """kernel -> its row's cells after the kernel's name, for the second block in bf16 NHWC."""
    done = subprocess.run([sys.executable, "bench/kernel_stack.py", "--only",
                           "second_block bf16 NHWC", *flags], cwd=REPO, capture_output=True,
                          text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return {line.split(" | ")[1]: line.split(" | ")[2:] for line in done.stdout.splitlines()
            if line.startswith("| second_block")}


def test_as_the_step_builds_it_a_kernel_is_specialised_and_its_sass_counted():
    """--as-step builds each kernel as Inductor's launch in the compiled step does (ints
    equal to 1 as constants, alignment marked, at the preset's sizes): leaner than the
    unspecialised build. --sass adds the instruction count and the commonest opcodes."""
    plain, step = _table(), _table("--as-step", "--sass")
    assert set(plain) == set(step) == {"_second_block_fwd_kernel", "_second_block_wgrad_kernel",
                                       "_second_block_xgrad_kernel"}
    for kernel, cells in step.items():
        assert int(cells[0]) <= int(plain[kernel][0]), kernel  # registers
        total, opcodes = cells[3].removesuffix(" |").split(": ")
        counts = [int(part.split()[1]) for part in opcodes.split(", ")]
        assert len(counts) == 8 and counts == sorted(counts, reverse=True)
        assert sum(counts) <= int(total)
    assert int(step["_second_block_xgrad_kernel"][0]) < int(plain["_second_block_xgrad_kernel"][0])


_KERNEL = """
import triton
import triton.language as tl
@triton.jit
def k(x_ptr, n, one, seven, C: tl.constexpr, BLOCK: tl.constexpr):
    pass
"""


def test_the_signature_marks_what_a_launch_would_specialise(tmp_path):
    """Unspecialised: ints as i32, only declared constexprs constant (C, passed by position,
    included). Specialised: the int equal to 1 constant, the int divisible by 16 and the
    aligned pointer marked divisible; 7 neither."""
    code = (f"{_KERNEL}\nimport torch\nfrom bench.kernel_stack import signature\n"
            "x = torch.zeros(64)\n"
            "for flag in (False, True):\n"
            "    print(signature(k, (x, 32, 1, 7, 4), {'BLOCK': 8}, flag))\n")
    (tmp_path / "sig.py").write_text(code)
    done = subprocess.run([sys.executable, str(tmp_path / "sig.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "TRITON_INTERPRET": "0"})
    assert done.returncode == 0, done.stderr[-2000:]
    plain, step = done.stdout.splitlines()
    assert plain == ("({'x_ptr': '*fp32', 'n': 'i32', 'one': 'i32', 'seven': 'i32', "
                     "'C': 'constexpr', 'BLOCK': 'constexpr'}, {'C': 4, 'BLOCK': 8}, {})")
    assert step == ("({'x_ptr': '*fp32', 'n': 'i32', 'one': 'constexpr', 'seven': 'i32', "
                    "'C': 'constexpr', 'BLOCK': 'constexpr'}, {'one': 1, 'C': 4, 'BLOCK': 8}, "
                    "{(0,): [['tt.divisibility', 16]], (1,): [['tt.divisibility', 16]]})")


_POOL_AS_STEP = """
import sys
sys.path.insert(0, ".")
import bench.kernel_stack as ks
from kernels.trunk import pool
seen = {}
pool.launch = lambda kernel, grid, *args, **meta: seen.setdefault(kernel.fn.__name__, args)
for what, thunk in ks.calls(256):
    if what == "pool bf16 NHWC":
        out = thunk()
        out.backward(ks.torch.randn_like(out))
bwd = seen["_pool_bwd_kernel"]
print(tuple(out.shape), out.is_contiguous(), bwd[5], bwd[8:12], bwd[12:16])
"""


def test_as_the_step_builds_it_the_pool_is_the_fourth_blocks(tmp_path):
    """At the step's sizes the pool is the fourth block's: 256 channels pooled flat for
    lin1, so its backward reads a pixel-contiguous gradient (the stride of a column 1) and
    writes a channels_last dx: the layouts that set its build."""
    (tmp_path / "pool.py").write_text(_POOL_AS_STEP)
    done = subprocess.run([sys.executable, str(tmp_path / "pool.py")], cwd=REPO,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split("\n")[0] == ("(2, 256, 16, 16) True 256 (65536, 256, 16, 1) "
                                          "(262144, 1, 8192, 256)")
