"""The model's FLOPs a step, and how much of the GPU's peak a run turns into them (MFU).

Counted, not modelled: FlopCounterMode runs the plain model's forward and backward once
on the "meta" device, so the figure is the same with every speed-up on or off (7.93
TFLOP a step at the GPU preset, 6.60 of them lin1's three GEMMs). What is counted, the
ledger and which time MFU divides by: docs/design.md, this module's section."""

from dataclasses import dataclass
from functools import lru_cache


@dataclass(frozen=True)
class Peak:
    bf16_flops: float  # dense (no 2:4 sparsity) bf16 tensor-core FLOP/s, data sheet
    hbm_bytes_per_s: float | None  # memory bandwidth, data sheet


# Matched in this order against torch.cuda.get_device_name(): the PCIe and NVL H100s
# before the SXM's plain "H100".
PEAKS = {
    "H100 PCIe": Peak(756e12, 2.0e12),
    "H100 NVL": Peak(835e12, 3.9e12),
    "H100": Peak(989e12, 3.35e12),
    "H200": Peak(989e12, 4.8e12),
    "A100": Peak(312e12, None),  # 40 and 80 GB parts differ in bandwidth
}


def peak_of(device_name: str | None) -> Peak | None:
    """The device's peaks, None where unknown (a CPU, or a GPU not in PEAKS)."""
    for key, peak in PEAKS.items():
        if device_name and key in device_name:
            return peak
    return None


@lru_cache(maxsize=16)
def step_flops(batch: int, image_size: int, capacity: int, hidden: int,
               mode: str = "train") -> int:
    """FLOPs of one step of the plain model at these shapes (module docstring): forward
    and backward in train mode, the forward alone in forward mode (2.64 of the GPU
    preset's 7.93 TFLOP: one GEMM of lin1's three, the convs' forward)."""
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from model.boxnet import BoxNet
    with torch.device("meta"):
        model = BoxNet(image_size, capacity, hidden)
        images = torch.empty(batch, 1, image_size, image_size, dtype=torch.uint8)
    with FlopCounterMode(display=False) as counter:
        out = model(images).float().sum()  # the loss: none of its FLOPs are counted
        if mode == "train":
            out.backward()
    return counter.get_total_flops()


def what_is_counted(mode: str) -> str:
    """The line's words for what step_flops counted in this mode."""
    return "forward and backward" if mode == "train" else "the forward alone"


def utilisation(flops: float, seconds: float | None, device_name: str | None) -> dict:
    """summary.json's account of `flops` done in `seconds`: the rate (TFLOP/s) and the MFU
    against the device's peak; None for what cannot be known."""
    peak = peak_of(device_name)
    rate = flops / seconds if seconds else None
    return {"tflop": flops / 1e12,
            "tflop_per_s": rate / 1e12 if rate else None,
            "peak_tflop_per_s": peak.bf16_flops / 1e12 if peak else None,
            "mfu": rate / peak.bf16_flops if rate and peak else None}


# The columns of make compare, ladder and throughput (cells()).
COLUMNS = ("model TFLOP/step", "TFLOP/s", "MFU %")


def cells(account: dict | None) -> dict:
    """A run's FLOPs columns from its summary's account; None ('-') where it has none (a
    summary from before they were counted) or no GPU time (a CPU run)."""
    account = account or {}
    mfu = account.get("mfu")
    return dict(zip(COLUMNS, (account.get("tflop"), account.get("tflop_per_s"),
                              None if mfu is None else mfu * 100)))


def mfu_text(mfu: float | None) -> str:
    return "-" if mfu is None else f"{mfu * 100:.1f} %"


def rate_text(tflop_per_s: float | None) -> str:
    return "-" if tflop_per_s is None else f"{tflop_per_s:.0f}"


def describe(account: dict, over: str, device_name: str, mode: str = "train") -> str:
    """The line under a table: 'model: 7.93 TFLOP a step (forward and backward,
    FlopCounterMode); over <over> 365 TFLOP/s, MFU 36.9 % of the dense bf16 peak (989
    TFLOP/s)', and the MFU at the sustained rate where the run has one."""
    line = (f"model: {account['tflop']:.3g} TFLOP a step ({what_is_counted(mode)}, "
            "FlopCounterMode)")
    if account["mfu"] is None:
        why = ("no GPU time" if account["tflop_per_s"] is None
               else f"no dense bf16 peak known for {device_name} (profiling/flops.py)")
        return f"{line}; MFU -: {why}"
    line = (f"{line}; over {over} {rate_text(account['tflop_per_s'])} TFLOP/s, MFU "
            f"{mfu_text(account['mfu'])} of the dense bf16 peak "
            f"({account['peak_tflop_per_s']:.0f} TFLOP/s)")
    if account.get("sustained_mfu") is not None:
        line += f"; at the sustained rate {mfu_text(account['sustained_mfu'])}"
    return line
