"""padded's loss with its gradient written out in PyTorch ops (losses/padded_by_hand.py):
the same forward, op for op and bit for bit, and a backward of 30 ATen ops where autograd's
takes 61 (and a fill and a copy more for each of its six slices' backwards).

Why it pays: each of the loss's kernels moves at most a few MB of the [B, M] slots, about
a microsecond of work, so its time is its kernel count, eager or replayed as a CUDA graph
(`graphed_loss`, which captures this loss when both are on). Every strategy but padded
has no such backward: the fused kernels write their own, the compiled ones are Inductor's.

Not bit for bit in the gradient: the same maths rounded in another order, within ~1e-7
of autograd's in fp32 (tests/losses/test_padded_by_hand.py), so the step's losses agree
to the 4 places the ladder prints.
"""

from training.speedups.base import SpeedUp


def refusal(cfg, cuda: bool) -> str | None:
    if cfg.loss != "padded":
        return (f"only padded's backward is autograd's over ~100 small PyTorch kernels; the "
                f"{cfg.loss} strategy's is not")
    return None


def by_hand(loss_fn):
    from losses.padded import padded_loss
    from losses.padded_by_hand import padded_loss_by_hand
    if loss_fn is not padded_loss:  # a swap, not a wrap: only padded's own loss is swapped
        raise TypeError("padded_backward_by_hand swaps padded's own loss, not "
                        f"{getattr(loss_fn, '__qualname__', loss_fn)!r}")
    return padded_loss_by_hand


SPEEDUP = SpeedUp(
    "padded_backward_by_hand",
    "padded's loss with its gradient written out in PyTorch ops (30 where autograd's "
    "backward runs 61): auto (padded in train mode), on, off",
    default="auto", refusal=refusal, loss=by_hand,
    idle=lambda cfg, on: "forward mode runs no backward" if cfg.mode != "train" else None)
