"""An fp32 master weight held as two 16-bit halves and a bit: the bf16 weight the GEMMs read
(its high half, rounded to nearest), a 16-bit low half, and one bit an element for the
one case 16 bits cannot hold (`--split-master`). Exact: the same master bits as fp32.

Why: the shadow SGD reads and writes the fp32 master (8 bytes an element); as weight plus
low half it moves 18 bytes an element instead of 20: 2.15 GB less a step and 2.0 GB less
memory for lin1's 1.07 B weights.

The design in full (layout, maths, byte ledger): docs/kernels.md, this module's section.
"""

import torch
import triton
import triton.language as tl

LOW_MAX = 32767  # low = +32768 (a tie rounded down) is stored here, its tie bit set
_CHUNK = 1 << 24  # elements a pass of split/join: int64 temporaries of 128 MB


def tie_words(shape) -> tuple:
    """The tie bits' shape: 32 elements a word along the last dimension, so that rows cut
    the bits where they cut the weight (training/parallel.py shards by rows)."""
    if len(shape) > 1 and shape[-1] % 32:
        raise ValueError(f"a split master's rows take 32 elements a word: {tuple(shape)}")
    return (*shape[:-1], -(-shape[-1] // 32))


def split(master: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """fp32 master -> (bf16 weight, int16 low, int32 tie bits): the weight torch's
    rounding of it."""
    if master.dtype != torch.float32:
        raise TypeError(f"split takes an fp32 master, not {master.dtype}")
    weight = master.to(torch.bfloat16)
    return (weight, *low_half(master, weight))


def low_half(master: torch.Tensor, weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int16 low, int32 tie bits) of an fp32 master whose bf16 rounding, weight, is
    already made (--bf16-shadow's parameter): not made again."""
    low = torch.empty(master.shape, dtype=torch.int16, device=master.device)
    ties = torch.zeros(tie_words(master.shape), dtype=torch.int32, device=master.device)
    flat_m, flat_w, flat_l = master.reshape(-1), weight.reshape(-1), low.view(-1)
    flat_t = ties.view(-1)
    for start in range(0, master.numel(), _CHUNK):  # a multiple of 32: whole words
        part = slice(start, start + _CHUNK)
        bits = flat_m[part].view(torch.int32).to(torch.int64) & 0xFFFFFFFF
        hi = (flat_w[part].view(torch.int16).to(torch.int64) & 0xFFFF) << 16
        rest = bits - hi
        tie = (rest > LOW_MAX).to(torch.int64)
        flat_l[part] = (rest - tie).to(torch.int16)
        words = _words(tie)
        flat_t[start // 32:start // 32 + words.numel()] = words
    return low, ties


def _words(tie: torch.Tensor) -> torch.Tensor:
    """0/1 int64 per element -> int32 words of 32 elements, element i at bit i % 32."""
    tie = torch.nn.functional.pad(tie, (0, -tie.numel() % 32)).view(-1, 32)
    words = (tie << torch.arange(32, device=tie.device)).sum(1)
    return torch.where(words >= 1 << 31, words - (1 << 32), words).to(torch.int32)


def join(weight: torch.Tensor, low: torch.Tensor, ties: torch.Tensor) -> torch.Tensor:
    """(bf16 weight, int16 low, int32 tie bits) -> the fp32 master they hold."""
    if weight.dtype != torch.bfloat16 or low.dtype != torch.int16 or \
            ties.dtype != torch.int32 or weight.shape != low.shape or \
            ties.shape != tie_words(weight.shape):
        raise TypeError("join takes a bf16 weight, an int16 low half of its shape and its "
                        "int32 tie bits")
    master = torch.empty(weight.shape, dtype=torch.float32, device=weight.device)
    flat_m, flat_w, flat_l = master.view(-1), weight.reshape(-1), low.reshape(-1)
    words = ties.reshape(-1).to(torch.int64) & 0xFFFFFFFF
    for start in range(0, weight.numel(), _CHUNK):
        part = slice(start, start + _CHUNK)
        index = torch.arange(start, min(start + _CHUNK, weight.numel()),
                             device=weight.device)
        tie = (words[index // 32] >> (index % 32)) & 1
        bits = ((flat_w[part].view(torch.int16).to(torch.int64) & 0xFFFF) << 16) + \
            flat_l[part].to(torch.int64) + tie
        bits = torch.where(bits >= 1 << 31, bits - (1 << 32), bits)  # uint32 -> int32
        flat_m[part] = bits.to(torch.int32).view(torch.float32)
    return master


@triton.jit
def join_bits(hi, low, tie):
    """int16 bits of the bf16 weight, int16 low, 0/1 tie -> the fp32 master, in a kernel."""
    bits = (hi.to(tl.uint16, bitcast=True).to(tl.uint32) << 16) + \
        (low.to(tl.int32) + tie).to(tl.uint32, bitcast=True)  # wraps: the sign's pattern
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def split_bits(master):
    """fp32 master -> (int16 bits of its bf16 rounding, int16 low, 0/1 tie), in a kernel:
    integer arithmetic, as kernels/rounding.py's bf16_rtne (the interpreter truncates
    casts)."""
    bits = master.to(tl.uint32, bitcast=True)
    hi = (bits + (((bits >> 16) & 1) + 0x7FFF)) >> 16
    low = bits.to(tl.int32, bitcast=True) - (hi << 16).to(tl.int32, bitcast=True)
    tie = (low > 32767).to(tl.int32)  # LOW_MAX: a tie rounded down
    return hi.to(tl.uint16).to(tl.int16, bitcast=True), (low - tie).to(tl.int16), tie
