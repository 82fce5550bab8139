"""Runs both GIoU kernel backends, both variants and the packed layout's kernels, and the
Triton first and second blocks, forward and backward, over odd shapes, for
compute-sanitizer (make test-gpu). Exits non-zero on a wrong answer; the sanitizer itself
reports out-of-bounds or misaligned accesses. The caching allocator is off so every
tensor is its own allocation and an overrun is visible."""

import os
import sys

os.environ["PYTORCH_NO_CUDA_MEMORY_CACHING"] = "1"
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

from kernels.giou import giou_loss  # noqa: E402
from tests.cases import make_case, second_block_inputs  # noqa: E402
from tests.reference import first_block_reference, reference_loss, rel_err, second_block_reference  # noqa: E402

# (B, M, prediction dtype, counts) over odd sizes, several chunks and no box at all.
SHAPES = ((1, 1, torch.float32, "full"), (3, 7, torch.bfloat16, "mixed"),
          (5, 256, torch.float16, "mixed"), (2, 1000, torch.bfloat16, "full"),
          (3, 2051, torch.bfloat16, "mixed"),  # 3 chunks
          (4, 33, torch.float32, "empty"))


def main() -> int:
    import losses
    from tests.reference import targets_for
    failures = 0
    for backend in ("triton", "cuda"):
        for conditional in (False, True):
            failures += sum(checked(
                f"{backend:6} conditional={conditional!s:5}", case,
                lambda p, c, b=backend, k=conditional: giou_loss(p, c.boxes, c.counts, b, k))
                for case in _cases())
        packed = losses.get("packed", backend=backend).loss
        failures += sum(checked(f"{backend:6} packed", case,
                                lambda p, c, f=packed: f(p, targets_for("packed", c)))
                        for case in _cases())
    failures += (first_block_cases() + second_block_cases() + pool_cases()
                 + conv_pool_cases() + shadow_sgd_cases() + float8_cast_cases()
                 + float8_update_cases())
    return 1 if failures else 0


def float8_cast_cases() -> int:
    """--float8-lin1's weight cast over sizes that end mid-block: both layouts against
    torch's cast with the kernel's scale, bit for bit."""
    from kernels.lin1.float8_cast import (
        BLOCK_COLS,
        BLOCK_ROWS,
        E4M3_MAX,
        SCALE,
        cast_weight,
        new_state,
    )
    failures = 0
    for rows, cols in ((1, 1), (BLOCK_ROWS + 1, 3), (17, BLOCK_COLS * 2 + 5)):
        w = torch.randn(rows, cols, device="cuda").bfloat16()
        w8 = torch.empty(rows, cols, dtype=torch.float8_e4m3fn, device="cuda")
        w8t = torch.empty(cols, rows, dtype=torch.float8_e4m3fn, device="cuda")
        state, inverse = new_state(w)
        cast_weight(w, w8, w8t, state, inverse)
        ref = (w.float() * state[SCALE]).clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn)
        # host-device sync: the check reads the results
        ok = torch.equal(w8.view(torch.uint8), ref.view(torch.uint8)) and torch.equal(
            w8t.view(torch.uint8), ref.t().contiguous().view(torch.uint8))
        print(f"float8_cast {rows}x{cols}: {'the same bits' if ok else 'WRONG'}")
        failures += not ok
    return failures


def float8_update_cases() -> int:
    """--float8-lin1's copy written by the shadow SGD (both forms; rows that end mid-block)
    and transposed after it, against the separate cast of the weight it made, bit for
    bit."""
    from kernels.lin1.float8_cast import cast_weight, new_state
    from kernels.lin1.master_halves import split
    from kernels.lin1.shadow_sgd import shadow_sgd_step
    failures = 0
    for rows, cols, form in ((37, 160, "fp32"), (37, 160, "split"), (3, 4128, "split")):
        master = torch.randn(rows, cols, device="cuda")
        weight, low, ties = split(master) if form == "split" else (master.bfloat16(), master,
                                                                   None)
        grad = torch.randn(rows, cols, device="cuda").bfloat16()
        buf = torch.empty(rows, cols, device="cuda")
        w8 = torch.empty(rows, cols, dtype=torch.float8_e4m3fn, device="cuda")
        w8t = torch.empty(cols, rows, dtype=torch.float8_e4m3fn, device="cuda")
        ref8, ref8t = torch.empty_like(w8), torch.empty_like(w8t)
        state, inverse = new_state(weight)
        shadow_sgd_step(low, grad, buf, weight, 0.5, 0.9, True, ties,
                        float8=(w8, w8t, state, inverse))
        ref_state = state.clone()
        ref_state[2:] = 0
        ref_state[2] = ref_state[1]  # the amax the roll read, so that it rolls to the same
        cast_weight(weight, ref8, ref8t, ref_state, torch.empty_like(inverse))
        # host-device sync: the check reads the results
        ok = torch.equal(w8.view(torch.uint8), ref8.view(torch.uint8)) and torch.equal(
            w8t.view(torch.uint8), ref8t.view(torch.uint8)) and torch.equal(
            state[2:].max(), weight.float().abs().max())
        print(f"float8 update {form} {rows}x{cols}: {'the same bits' if ok else 'WRONG'}")
        failures += not ok
    return failures


def shadow_sgd_cases() -> int:
    """lin1's shadow SGD (--bf16-shadow) over odd sizes, first and later steps: master
    and momentum against float64 by relative error, the bf16 copy against bf16(master);
    and the split master's form (--split-master, a fifth of the masters on a tie), with
    and without --skip-unchanged-weight's masked store, against the fp32 form, bit for
    bit."""
    from kernels.lin1.master_halves import join, split
    from kernels.lin1.shadow_sgd import BLOCK, shadow_sgd_step
    failures = 0
    for n in (1, 37, BLOCK - 1, BLOCK + 1, 3 * BLOCK + 517):
        master = torch.randn(n, device="cuda")
        master.view(torch.int32)[::5] = master.view(torch.int32)[::5] & ~0xFFFF | 0x8000
        buf = torch.randn(n, device="cuda")
        grad = torch.randn(n, device="cuda").bfloat16()
        shadow = torch.empty(n, dtype=torch.bfloat16, device="cuda")
        weight, low, ties = split(master)
        skipping = split(master)
        buf_split, buf_skip = buf.clone(), buf.clone()
        for first in (True, False):
            ref_buf = grad.double() + (0 if first else 0.9 * buf.double())
            ref = master.double() - 0.1 * ref_buf
            shadow_sgd_step(master, grad, buf, shadow, 0.1, 0.9, first)
            shadow_sgd_step(low, grad, buf_split, weight, 0.1, 0.9, first, ties)
            shadow_sgd_step(skipping[1], grad, buf_skip, skipping[0], 0.1, 0.9, first,
                            skipping[2], skip_unchanged=True)
            torch.cuda.synchronize()  # host-device sync: the check reads the results
            err = max(rel_err(master, ref), rel_err(buf, ref_buf))  # host-device sync
            same = torch.equal(join(weight, low, ties).view(torch.int32),
                               master.view(torch.int32)) and torch.equal(buf_split, buf) \
                and torch.equal(weight, shadow) and torch.equal(buf_skip, buf) and \
                all(torch.equal(a, b) for a, b in zip(skipping, (weight, low, ties)))
            ok = err < 1e-6 and torch.equal(shadow, master.bfloat16()) and same
            print(f"shadow_sgd n={n} first={first}: rel err {err:.1e}, split form "
                  f"{'the same bits' if same else 'DIFFERENT'} {'ok' if ok else 'WRONG'}")
            failures += not ok
    return failures


def _cases():
    for B, M, dtype, counts in SHAPES:
        yield make_case("mixed", B, M, dtype, counts=counts).to("cuda")


def checked(label: str, case, loss_fn) -> bool:
    """Runs loss_fn(pred, case) forward and backward; True (a failure) on a wrong loss or
    a non-finite gradient."""
    pred = case.pred.clone().requires_grad_(True)
    loss = loss_fn(pred, case)
    loss.backward()
    torch.cuda.synchronize()  # host-device sync: the check reads the results
    ref, _ = reference_loss(case.pred, case.boxes, case.counts)
    err = rel_err(loss, ref, 1.0)
    ok = err < 1e-5 and torch.isfinite(pred.grad).all().item()  # host-device sync
    B, M = case.pred.shape[:2]
    print(f"{label} B={B} M={M:4} {case.pred.dtype}: loss rel err {err:.1e} "
          f"{'ok' if ok else 'WRONG'}")
    return not ok


def first_block_cases() -> int:
    """The Triton first block over odd sizes, both layouts, fp32, bf16 and fp16 outputs,
    both backwards (recomputing the conv, or from the kept code)."""
    from kernels.trunk.first_block import first_block
    failures = 0
    for B, H, W, dtype, channels_last, keep_code in (
            (1, 2, 2, torch.float32, False, False), (3, 6, 10, torch.bfloat16, True, False),
            (2, 66, 34, torch.float32, True, False), (5, 256, 256, torch.bfloat16, False, False),
            (1, 2, 2, torch.float32, True, True), (3, 6, 10, torch.float16, False, True),
            (5, 256, 256, torch.bfloat16, True, True)):
        images = torch.randint(0, 256, (B, 1, H, W), dtype=torch.uint8, device="cuda")
        weight = torch.randn(4, 1, 3, 3, device="cuda", requires_grad=True)
        bias = torch.randn(4, device="cuda", requires_grad=True)
        out = first_block(images, weight, bias, dtype, channels_last, keep_code)
        out.float().sum().backward()
        torch.cuda.synchronize()  # host-device sync: the check reads the results
        expected = first_block_reference(images.cpu(), weight.detach().cpu(),
                                         bias.detach().cpu())
        err = rel_err(out.cpu(), expected)
        ok = err < (1e-6 if dtype == torch.float32 else 1e-2) and \
            torch.isfinite(weight.grad).all().item()  # host-device sync
        failures += not ok
        print(f"first_block B={B} {H}x{W} {dtype} channels_last={channels_last} "
              f"keep_code={keep_code}: rel err "
              f"{err:.1e} {'ok' if ok else 'WRONG'}")
    return failures


def pool_cases() -> int:
    """The Triton bias + max-pool + ReLU (--triton-pool) over odd sizes, channels that are
    not a multiple of its block, both layouts and the flat output, the model's conv4 shape
    last (B=64 of its [256, 32, 32] conv outputs)."""
    import torch.nn.functional as F

    from kernels.trunk.pool import pool_bias_relu
    failures = 0
    for B, C, H, W, dtype, channels_last, flat in ((1, 3, 2, 2, torch.float32, False, False),
                                                   (3, 69, 10, 6, torch.bfloat16, True, False),
                                                   (2, 64, 66, 34, torch.float16, True, True),
                                                   (64, 256, 32, 32, torch.bfloat16, True,
                                                    True)):
        x = torch.randn(B, C, H, W, device="cuda").to(dtype)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        bias = torch.randn(C, device="cuda", requires_grad=True)
        x.requires_grad_(True)
        out = pool_bias_relu(x, bias, flat)
        out.float().sum().backward()
        torch.cuda.synchronize()  # host-device sync: the check reads the results
        expected = torch.relu(F.max_pool2d(x.detach() + bias.detach().to(dtype)[:, None, None],
                                           2))
        ok = torch.equal(out, expected) and torch.isfinite(bias.grad).all().item() and \
            torch.isfinite(x.grad).all().item()  # host-device syncs
        failures += not ok
        print(f"pool_bias_relu B={B} C={C} {H}x{W} {dtype} channels_last={channels_last} "
              f"flat={flat}: {'equal' if ok else 'WRONG'}")
    return failures


def conv_pool_cases() -> int:
    """The third block's Triton forward (--triton-conv-pool) and both its backwards (the
    pool's kernel and cuDNN's; --triton-conv-pool-bwd's two kernels) over odd sizes, both
    layouts, fp32, fp16 and bf16, the model's size last (B=64 of its [16, 64, 64] inputs:
    1,024 blocks over 264 programs, ~4 a program): values against the unfused graph
    (cuDNN's conv, the pool kernel), and the two backwards' gradients against each other,
    within a rounding."""
    from kernels.trunk.conv_pool import conv_pool_bias_relu, unfused
    failures = 0
    for B, H, W, dtype, channels_last in ((1, 2, 2, torch.float32, False),
                                          (3, 10, 6, torch.float16, True),
                                          (5, 34, 66, torch.bfloat16, True),
                                          (64, 64, 64, torch.bfloat16, True)):
        x = torch.randn(B, 16, H, W, device="cuda").to(dtype)
        if channels_last:
            x = x.to(memory_format=torch.channels_last)
        weight = torch.randn(64, 16, 3, 3, device="cuda") * 0.2
        bias = torch.randn(64, device="cuda")
        expected = unfused(x, weight, bias).float()
        grads = []
        for triton_backward in (False, True):
            leaves = [t.clone().requires_grad_(True) for t in (x, weight, bias)]
            out = conv_pool_bias_relu(*leaves, triton_backward)
            out.float().sum().backward()
            torch.cuda.synchronize()  # host-device sync: the check reads the results
            err = ((out.float() - expected).norm() / expected.norm()).item()  # host sync
            grads.append([t.grad.float() for t in leaves])
        g_err = max(((a - b).norm() / b.norm().clamp_min(1e-30)).item()  # host syncs
                    for a, b in zip(grads[1], grads[0], strict=True))
        ok = err < 1e-3 and g_err < 5e-3
        failures += not ok
        print(f"conv_pool_bias_relu B={B} {H}x{W} {dtype} channels_last={channels_last}: "
              f"{'equal within a rounding' if ok else 'WRONG'} (rel {err:.1e}; the two "
              f"backwards' gradients {g_err:.1e})")
    return failures


def second_block_cases() -> int:
    """The Triton second block over odd sizes, both layouts, fp32 and bf16, the model's
    size last (B=64 of its 128x128 inputs)."""
    from kernels.trunk.second_block import second_block
    failures = 0
    for B, H, W, dtype, channels_last in ((1, 2, 2, torch.float32, False),
                                          (3, 6, 10, torch.bfloat16, True),
                                          (2, 66, 34, torch.float32, True),
                                          (64, 128, 128, torch.bfloat16, True)):
        x, weight, bias = second_block_inputs(B, H, W, "cuda", dtype, channels_last,
                                              decisive=B < 64)  # not the model's size
        x.requires_grad_(True)
        weight.requires_grad_(True)
        out = second_block(x, weight, bias)
        out.float().sum().backward()
        torch.cuda.synchronize()  # host-device sync: the check reads the results
        expected = second_block_reference(x.detach().cpu(), weight.detach().cpu(), bias.cpu())
        err = rel_err(out.cpu(), expected)
        ok = err < (1e-6 if dtype == torch.float32 else 1e-2) and \
            torch.isfinite(weight.grad).all().item() and \
            torch.isfinite(x.grad).all().item()  # host-device syncs
        failures += not ok
        print(f"second_block B={B} {H}x{W} {dtype} channels_last={channels_last}: rel err "
              f"{err:.1e} {'ok' if ok else 'WRONG'}")
    return failures


if __name__ == "__main__":
    sys.exit(main())
