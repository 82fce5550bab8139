"""lin1's shadow SGD in the epilogue of its weight-gradient GEMM (`--update-in-gemm`): one
Triton kernel computes a tile of dW = dY^T @ X over the tensor cores, rounds it to bf16
(the gradient the GEMM writes today), and in the same program updates that tile of the
fp32 master and momentum and writes the bf16 weight the next forward reads.

Why: the step ran the dW GEMM (2.2 TFLOP: compute-bound, HBM mostly idle) and
then the shadow SGD (21.5 GB: memory-bound, tensor cores idle) one after the other, and a
second stream hid nothing (the GEMM holds every SM). Here a program's epilogue moves its
tile's bytes while the other programs on the SM run their main loops, and the 2.1 GB bf16
gradient is never written nor read back.

Maths, per element of lin1's weight [H, F], with dY [K, H] (the gradient at lin1's output)
and X [K, F] (its input), K the batch (the global batch on a tensor-parallel rank):
    g = bf16(sum_k dY[k, h] * X[k, f])         fp32 accumulation, rounded to nearest even
    first step:  buf = g                        later steps: buf = mu * buf + g
    master = master - lr * buf                  weight = bf16(master)
which is kernels/lin1/shadow_sgd.py's step on the gradient cuBLAS would have written
(the sum's order differs: the gradient agrees within bf16 rounding, not bit for bit).

Byte ledger per element of the weight: reads master 4 + buf 4 (0 on the first step),
writes master 4 + buf 4 + weight 2 = 18 bytes (the SGD alone: 20, and the GEMM wrote 2):
19.3 GB for lin1, ~6.4 ms at 3 TB/s: the floor of the GEMM and the SGD together, if the
epilogue's traffic hid entirely under the GEMM's tensor-core work.
The operands (dY 33 MB, X 134 MB at K = 1024) are read once from HBM and then from L2:
programs are grouped GROUP_H tiles of H to a tile of F.

Its own GEMM is slower than cuBLAS's, which eats what its epilogue overlaps: measured, it
takes what the GEMM and the SGD take apart (results/step.md), so --update-in-gemm is off by
default.

A plain launcher like the SGD's: it runs in the optimizer's step, outside autograd and
outside torch.compile (training/speedups/bf16_shadow.py calls it; kernels/lin1/
deferred_linear.py hands it dY and X).
"""

import torch
import triton
import triton.language as tl

from core.errors import InputError
from kernels.rounding import bf16_rtne, round_to
from kernels.triton_op import INTERPRETED

# Tiles: the fastest of bench/roofline.py --configs on the H100 (results/step.md); the
# interpreter (CPU tests) takes small ones. SPLIT: the epilogue in that many column
# strips of the tile, so that its master and momentum loads do not hold a whole tile's
# registers beside the accumulator's. (Issuing the epilogue's loads before the main loop
# was slower, and removed: results/step.md.)
GPU_CONFIG = dict(BLOCK_H=64, BLOCK_F=128, BLOCK_K=64, GROUP_H=8, SPLIT=2, num_warps=4,
                  num_stages=3)
CPU_CONFIG = dict(BLOCK_H=16, BLOCK_F=16, BLOCK_K=16, GROUP_H=2, SPLIT=2, num_warps=4,
                  num_stages=1)
# What a launch computes: the whole step; for bench/roofline.py's decomposition only, the
# GEMM alone (its bf16 result into weight) or the epilogue alone (on a zero gradient).
WHOLE, GEMM_ONLY, EPILOGUE_ONLY = 0, 1, 2


@triton.jit
def _dw_update_kernel(dyt_ptr, x_ptr, master_ptr, buf_ptr, weight_ptr, H, F, K, lr,
                      momentum, FIRST: tl.constexpr, BLOCK_H: tl.constexpr,
                      BLOCK_F: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_H: tl.constexpr,
                      SPLIT: tl.constexpr, PART: tl.constexpr, UPCAST: tl.constexpr):
    # Grouped order: GROUP_H consecutive programs share a tile of F, so X's columns are
    # read from HBM once and then from L2.
    pid = tl.program_id(0)
    tiles_h = tl.cdiv(H, BLOCK_H)
    tiles_f = tl.cdiv(F, BLOCK_F)
    per_group = GROUP_H * tiles_f
    first_h = (pid // per_group) * GROUP_H
    group_h = min(tiles_h - first_h, GROUP_H)
    h0 = (first_h + (pid % per_group) % group_h) * BLOCK_H
    f0 = ((pid % per_group) // group_h) * BLOCK_F

    # dY^T is [H, K] and X is [K, F], both row-major: A K-contiguous, B F-contiguous, as
    # the tensor cores' operands are laid out in Triton's own matmul.
    rows = h0 + tl.arange(0, BLOCK_H)
    cols = f0 + tl.arange(0, BLOCK_F)
    ks = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_H, BLOCK_F), dtype=tl.float32)
    if PART != 2:
        for k0 in range(0, K, BLOCK_K):
            k = k0 + ks
            a = tl.load(dyt_ptr + rows[:, None] * K + k[None, :],
                        mask=(rows[:, None] < H) & (k[None, :] < K), other=0.0)
            b = tl.load(x_ptr + k[:, None] * F + cols[None, :],
                        mask=(k[:, None] < K) & (cols[None, :] < F), other=0.0)
            if UPCAST:  # Triton's interpreter multiplies bf16 as the integers it stores
                a = a.to(tl.float32)
                b = b.to(tl.float32)
            acc = tl.dot(a, b, acc)  # bf16 products are exact in fp32 either way
    g = round_to(acc, tl.bfloat16)  # the bf16 gradient the GEMM would have written, in fp32
    if SPLIT == 1:
        _update_strip(g, master_ptr, buf_ptr, weight_ptr, H, F, h0, f0, lr, momentum,
                      FIRST, PART, BLOCK_H, BLOCK_F)
    else:  # two strips of BLOCK_F / 2 columns: g's halves, split in registers
        halves = tl.permute(tl.reshape(g, (BLOCK_H, 2, BLOCK_F // 2)), (0, 2, 1))
        left, right = tl.split(halves)
        _update_strip(left, master_ptr, buf_ptr, weight_ptr, H, F, h0, f0, lr, momentum,
                      FIRST, PART, BLOCK_H, BLOCK_F // 2)
        _update_strip(right, master_ptr, buf_ptr, weight_ptr, H, F, h0, f0 + BLOCK_F // 2,
                      lr, momentum, FIRST, PART, BLOCK_H, BLOCK_F // 2)


@triton.jit
def _update_strip(g, master_ptr, buf_ptr, weight_ptr, H, F, h0, f0, lr, momentum,
                  FIRST: tl.constexpr, PART: tl.constexpr, ROWS: tl.constexpr,
                  COLS: tl.constexpr):
    """The SGD step of the weight's [ROWS, COLS] strip at (h0, f0) from its gradient g.
    Offsets in int32: the launcher refuses a weight of 2^31 elements or more."""
    rows = h0 + tl.arange(0, ROWS)
    cols = f0 + tl.arange(0, COLS)
    at = rows[:, None] * F + cols[None, :]
    inside = (rows[:, None] < H) & (cols[None, :] < F)
    if PART == 1:  # the GEMM alone: its bf16 result, as cuBLAS would write it
        tl.store(weight_ptr + at, bf16_rtne(g), mask=inside)
    else:
        if FIRST:
            buf = g
        else:
            buf = tl.load(buf_ptr + at, mask=inside, other=0.0) * momentum + g
        tl.store(buf_ptr + at, buf, mask=inside)
        master = tl.load(master_ptr + at, mask=inside, other=0.0) - lr * buf
        tl.store(master_ptr + at, master, mask=inside)
        tl.store(weight_ptr + at, bf16_rtne(master), mask=inside)


def dw_update_step(dy: torch.Tensor, x: torch.Tensor, master: torch.Tensor,
                   buf: torch.Tensor, weight: torch.Tensor, lr: float, momentum: float,
                   first: bool, config: dict | None = None, part: int = WHOLE) -> None:
    """One SGD step of the weight from its GEMM's operands, in place on master, buf and
    weight: dy [K, H] and x [K, F] bf16, master and buf [H, F] fp32, weight [H, F] bf16.
    No sync. config: the tiles; part: GEMM_ONLY or EPILOGUE_ONLY (bench/roofline.py)."""
    check_operands(dy, x, master, buf, weight)
    (K, H), F = dy.shape, x.shape[1]
    if max(H * F, K * F, K * H) >= 2 ** 31:
        raise InputError(f"the update in the GEMM indexes in int32: a weight of {H} x {F} "
                         f"with a batch of {K} is too large")
    meta = dict(config or (CPU_CONFIG if INTERPRETED else GPU_CONFIG))
    # dY^T row-major, K contiguous: the main loop's A operand as the tensor cores take it
    # (a 33 MB copy at the GPU preset).
    dyt = dy.t().contiguous()
    grid = (triton.cdiv(H, meta["BLOCK_H"]) * triton.cdiv(F, meta["BLOCK_F"]),)
    _dw_update_kernel[grid](dyt, x, master, buf, weight, H, F, K, lr, momentum, FIRST=first,
                            PART=part, UPCAST=INTERPRETED, **meta)


def check_operands(dy, x, master, buf, weight) -> None:
    """One line for what the kernel cannot take."""
    if dy.dim() != 2 or x.dim() != 2 or dy.shape[0] != x.shape[0]:
        raise InputError(f"the update in the GEMM takes dY [K, H] and X [K, F], not "
                         f"{tuple(dy.shape)} and {tuple(x.shape)}")
    shape = (dy.shape[1], x.shape[1])
    if not all(t.shape == shape for t in (master, buf, weight)):
        raise InputError(f"the update in the GEMM needs master, momentum and weight of "
                         f"shape {shape}")
    if dy.dtype != torch.bfloat16 or x.dtype != torch.bfloat16 or \
            weight.dtype != torch.bfloat16:
        raise InputError("the update in the GEMM takes bf16 dY, X and weight")
    if master.dtype != torch.float32 or buf.dtype != torch.float32:
        raise InputError("the update in the GEMM keeps fp32 master weights and momentum")
    tensors = (dy, x, master, buf, weight)
    if not all(t.is_contiguous() for t in tensors):
        raise InputError("the update in the GEMM takes contiguous tensors")
    if len({t.device for t in tensors}) != 1:
        raise InputError("the update in the GEMM's tensors must be on one device")
