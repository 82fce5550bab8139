"""An independent float64 GIoU loss: its own code (not losses/giou.py), one sample at a
time, gradients by float64 autograd. Tie and boundary conventions are PyTorch's (half
the gradient at a max/min tie, clamp passes at zero), which the kernels document."""

import torch
import torch.nn.functional as F


def reference_loss(pred, boxes, counts):
    """pred [B, M, 4] any float dtype; boxes [B, M, 4]; counts [B]. Returns (loss, grad)
    in float64 on the CPU, grad w.r.t. pred."""
    p = pred.detach().cpu().to(torch.float64).requires_grad_(True)
    g = boxes.detach().cpu().to(torch.float64)
    eps = 1e-7
    total = p.sum() * 0.0
    n_total = 0
    for b, n in enumerate(counts.cpu().tolist()):
        x1, y1, x2, y2 = p[b, :n].unbind(-1)
        a1, b1, a2, b2 = g[b, :n].unbind(-1)
        iw = torch.clamp(torch.min(x2, a2) - torch.max(x1, a1), min=0)
        ih = torch.clamp(torch.min(y2, b2) - torch.max(y1, b1), min=0)
        inter = iw * ih
        union = (x2 - x1) * (y2 - y1) + (a2 - a1) * (b2 - b1) - inter
        hull = (torch.max(x2, a2) - torch.min(x1, a1)) * (torch.max(y2, b2) - torch.min(y1, b1))
        giou = inter / (union + eps) - (hull - union) / (hull + eps)
        total = total + (1 - giou).sum()
        n_total += n
    loss = total / max(n_total, 1)
    loss.backward()
    return loss.detach(), p.grad


def rel_err(actual, expected, floor: float = 0.0) -> float:
    """||actual - expected|| / max(||expected||, floor). The loss lies in [0, 2], so it is
    compared with floor 1: identical boxes give 0 in fp32 and ~1e-10 (the eps) in fp64."""
    actual = actual.detach().cpu().to(torch.float64)
    expected = expected.detach().cpu().to(torch.float64)
    assert torch.isfinite(actual).all(), "non-finite values"
    scale = max(float(expected.norm()), floor)
    diff = float((actual - expected).norm())
    return diff / scale if scale > 0 else diff


def grad_floor(upstream: float, counts) -> float:
    """The scale under which a gradient's norm counts as zero: upstream/N per box, times
    1e-2 (a box coordinate's derivative is ~1/size, size up to 255 px), over all valid
    coordinates. At identical boxes the exact gradient is ~1e-13 (eps only) and fp32 gives
    0 or ~1e-8: both are zero at this scale."""
    n = int(counts.sum())
    return upstream / max(n, 1) * 1e-2 * (4 * max(n, 1)) ** 0.5


DTYPES = (torch.float32, torch.bfloat16, torch.float16)
# Kernels and PyTorch strategies compute in fp32; gradients come back in the predictions'
# dtype, so bf16/fp16 gradients carry their rounding (2^-8, 2^-11 relative).
GRAD_TOL = {torch.float32: 1e-5, torch.bfloat16: 8e-3, torch.float16: 1e-3,
            torch.float64: 1e-10}
LOSS_TOL = 1e-5


def targets_for(name, case):
    """The case's targets in the layout of strategy `name`."""
    from core.names import PACKED, RAGGED
    from data.collate import packed_targets
    if name in RAGGED:
        return case.targets
    if name in PACKED:
        device = case.pred.device
        boxes, index, offsets = (t.to(device) for t in packed_targets(
            [t.cpu() for t in case.targets]))
        return boxes, index, offsets
    return case.boxes, case.counts


def check_against_reference(strategy, case, device="cpu"):
    case = case.to(device)
    pred = case.pred.clone().requires_grad_(True)
    upstream = float(torch.empty(()).uniform_(0.5, 2.0)) * 256  # exercises grad_loss
    loss = strategy.loss(pred, targets_for(strategy.name, case))
    (loss * upstream).backward()
    ref_loss, ref_grad = reference_loss(case.pred, case.boxes, case.counts)
    where = f"{strategy.name} seed={case.seed} dtype={case.pred.dtype}"
    assert loss.dim() == 0 and torch.isfinite(loss), where
    assert rel_err(loss, ref_loss, floor=1.0) < LOSS_TOL, where
    assert pred.grad.dtype == case.pred.dtype, where
    tol = GRAD_TOL[case.pred.dtype]
    floor = grad_floor(upstream, case.counts)
    assert rel_err(pred.grad, ref_grad * upstream, floor) < tol, where


def first_block_reference(images, weight, bias):
    """The model's first three modules in float64."""
    x = images.double() / 255
    return F.relu(F.max_pool2d(F.conv2d(x, weight.double(), bias.double(), padding=1), 2))


def second_block_reference(x, weight, bias):
    """The model's blocks[3:6] in float64."""
    return F.relu(F.max_pool2d(F.conv2d(x.double(), weight.double(), bias.double(),
                                        padding=1), 2))


def pool_windows(v):
    """[B, C, H, W] -> [B, C, H // 2, W // 2, 4]: each 2x2 pooling window's four values
    (an odd last row or column left out, as max_pool2d leaves it)."""
    B, C, H, W = v.shape
    return (v[:, :, :H // 2 * 2, :W // 2 * 2].reshape(B, C, H // 2, 2, W // 2, 2)
            .permute(0, 1, 2, 4, 3, 5).reshape(B, C, H // 2, W // 2, 4))


def drawn_until(draw, keep, seed=None, tries: int = 30):
    """draw(generator) from seed (a fresh one if None), drawn again from fresh seeds until
    keep(*drawn) holds: the kernel tests' inputs, redrawn near a decision fp32 may take
    otherwise than float64; keep None takes the first draw. The tests' sizes refuse at most
    55 % of draws (30 in a row: 2e-8); at the model's size every draw was refused (100 in
    a row, on an H100)."""
    for _ in range(tries):
        gen = torch.Generator().manual_seed(torch.randint(0, 2**31, ()).item()
                                            if seed is None else seed)
        seed = None
        drawn = draw(gen)
        if keep is None or keep(*drawn):
            return drawn
    raise AssertionError(f"{tries} draws in a row, each with a near decision: at this size "
                         "every draw may hold one; draw once (decisive=False) where the "
                         "check's bound holds for them")


def nearest_pool_decision(v) -> float:
    """How near a 2x2 max-pool, then a ReLU, over v (float64: the values the pool takes)
    comes to deciding otherwise: the least gap between a window's max and another of its
    values, or between the max and 0. A kernel that sums v in fp32 may decide otherwise
    within fp32's error, and send a gradient to another pixel. Exact ties are left out:
    equal inputs give equal values in any precision, decided alike."""
    windows = pool_windows(v)
    top = windows.max(-1, keepdim=True).values
    gaps = (top - windows).flatten()
    gaps = gaps[gaps > 0]
    nearest_tie = gaps.min().item() if gaps.numel() else float("inf")
    return min(nearest_tie, top.abs().min().item())
