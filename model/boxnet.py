"""The workload's detector: four conv blocks, two linear layers, a box head.

Conv2d(4^i -> 4^(i+1), 3x3, 'same') -> MaxPool(2) -> ReLU for i = 0..3 (channels
1->4->16->64->256, spatial S -> S/16), flatten, Linear -> hidden, ReLU, Linear ->
capacity*4. At the workload's size (S=256, hidden 16384, 256 boxes) lin1 alone is
65,536 x 16,384 = 1.07 B parameters (4.3 GB in fp32).

The original head emitted unconstrained numbers, so "boxes" could have x2 < x1. Here the
head maps its output to valid pixel-space boxes: a top-left corner and a positive size,
each sigmoid-scaled to the image, so x2 >= x1 and y2 >= y1 always.
"""

import torch
import torch.nn.functional as F
from torch import nn

from kernels.deferred_linear import PendingGrad, deferred_linear
from kernels.triton_conv_pool import conv_pool_bias_relu
from kernels.triton_first_block import first_block
from kernels.triton_pool import pool_bias_relu
from kernels.triton_second_block import second_block


class BoxNet(nn.Module):
    def __init__(self, image_size: int = 256, capacity: int = 256, hidden: int = 16384,
                 triton_first_block: bool = False, channels_last: bool = False,
                 block_dtype: torch.dtype = torch.float32, bf16_shadow: bool = False,
                 triton_second_block: bool = False, update_in_gemm: bool = False,
                 triton_pool: bool = False, triton_conv_pool: bool = False,
                 triton_conv_pool_bwd: bool = False):
        super().__init__()
        if image_size % 16:
            raise ValueError(f"image size {image_size} must be a multiple of 16 "
                             "(four 2x2 max-pools)")
        blocks = []
        for i in range(4):
            blocks += [nn.Conv2d(4 ** i, 4 ** (i + 1), 3, padding="same"),
                       nn.MaxPool2d(2), nn.ReLU()]
        self.features = nn.Sequential(*blocks)
        flat = 256 * (image_size // 16) ** 2
        self.lin1 = nn.Linear(flat, hidden)
        self.lin2 = nn.Linear(hidden, capacity * 4)
        self.image_size = image_size
        self.capacity = capacity
        # --triton-first-block: blocks[0:3] run as one Triton kernel, whose output dtype
        # is the one autocast would give the conv (block_dtype), chosen at build time.
        self.triton_first_block = triton_first_block
        self.block_dtype = block_dtype
        # --triton-second-block: blocks[3:6] as Triton kernels (kernels/
        # triton_second_block.py), in its input's dtype, as autocast would run the conv.
        self.triton_second_block = triton_second_block
        # --triton-pool: the later blocks' conv without its bias, then bias, max-pool and
        # ReLU in one Triton kernel (kernels/triton_pool.py).
        self.triton_pool = triton_pool
        # --triton-conv-pool: the third block's forward (conv, bias, max-pool, ReLU) as one
        # Triton kernel (kernels/triton_conv_pool.py).
        self.triton_conv_pool = triton_conv_pool
        # --triton-conv-pool-bwd: that block's backward as Triton kernels too (kernels/
        # triton_conv_pool_bwd.py), from the forward's pooled gradient and code.
        self.triton_conv_pool_bwd = triton_conv_pool_bwd
        self.channels_last = channels_last
        # False where a design of several GPUs must not be compiled whole: then only the
        # trunk is (training/parallel.py says why; model/build.py reads it).
        self.compile_whole = True
        if channels_last:
            self.to(memory_format=torch.channels_last)
        # --bf16-shadow: lin1.weight a bf16 parameter, its fp32 master a buffer that the
        # optimizer updates (training/bf16_shadow.py).
        self.bf16_shadow = bf16_shadow
        if bf16_shadow:
            self.register_buffer("lin1_master", make_shadow(self.lin1))
        # --update-in-gemm: lin1's backward leaves its weight gradient to the optimizer,
        # whose step runs the GEMM with the update in its epilogue (kernels/
        # deferred_linear.py); torch.compile cannot trace that backward, so only the trunk
        # is compiled.
        self.lin1_pending = PendingGrad() if update_in_gemm else None
        if update_in_gemm:
            self.compile_whole = False

    def shadowed(self) -> list:
        """[(bf16 parameter, fp32 master, PendingGrad or None)] for the optimizer; empty
        without --bf16-shadow."""
        return ([(self.lin1.weight, self.lin1_master, self.lin1_pending)]
                if self.bf16_shadow else [])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 1, S, S] -> boxes [B, capacity, 4] as (x1, y1, x2, y2) pixels."""
        raw = self.head(self.flat_features(images)).view(-1, self.capacity, 4)
        return boxes_from_raw(raw, self.image_size)

    def flat_features(self, images: torch.Tensor) -> torch.Tensor:
        """The trunk's output flattened for lin1: [B, 256 * (S/16)^2]. A method of its own
        so that a model not compiled whole (--parallel tp, --update-in-gemm) compiles it
        apart from the head (model/build.py), flatten included: the flatten of the
        channels_last output is a transposing copy that Inductor fuses into the last
        pool/ReLU (eager, it and its backward took 0.89 ms a step on the H100)."""
        return self.trunk(images).flatten(1)

    def trunk(self, images: torch.Tensor) -> torch.Tensor:
        """The four conv blocks: uint8 [B, 1, S, S] -> [B, 256, S/16, S/16]."""
        if self.triton_first_block:
            conv = self.features[0]
            x = first_block(images, conv.weight, conv.bias, self.block_dtype,
                            self.channels_last)
        else:
            x = self.features[:3](images.float() * (1.0 / 255.0))
        if self.triton_second_block:
            conv = self.features[3]
            x = second_block(x, conv.weight, conv.bias)
        else:
            x = self.features[3:6](x)
        return self.later_blocks(x)

    def later_blocks(self, x: torch.Tensor) -> torch.Tensor:
        """The third and fourth blocks. With --triton-pool each conv runs without its
        bias, which the pool kernel adds before it pools; the last block's output is
        written contiguous, so that flat_features' flatten is a view. With
        --triton-conv-pool the third block's forward is one Triton kernel (and with
        --triton-conv-pool-bwd its backward two)."""
        if self.triton_conv_pool:
            conv = self.features[6]
            x = conv_pool_bias_relu(x, conv.weight, conv.bias, self.triton_conv_pool_bwd)
        elif self.triton_pool:
            x = self._pooled_block(6, x, flat=False)
        else:
            x = self.features[6:9](x)
        if self.triton_pool:
            return self._pooled_block(9, x, flat=True)
        return self.features[9:](x)

    def _pooled_block(self, k: int, x: torch.Tensor, flat: bool) -> torch.Tensor:
        """features[k]'s conv without its bias, then the Triton bias + pool + ReLU."""
        conv = self.features[k]
        x = F.conv2d(x, conv.weight, None, conv.stride, conv.padding, conv.dilation,
                     conv.groups)
        return pool_bias_relu(x, conv.bias, flat=flat)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """lin1, ReLU, lin2 on the flattened features."""
        if self.lin1_pending is not None:
            h = deferred_linear(x, self.lin1.weight, self.lin1.bias, self.lin1_pending)
        else:
            h = self.lin1(x)
        return self.lin2(torch.relu(h))


def make_shadow(linear: torch.nn.Linear) -> torch.Tensor:
    """Turns linear.weight into a bf16 parameter; returns its fp32 master (the old storage:
    nothing is copied but the bf16 cast)."""
    master = linear.weight.data
    linear.weight = torch.nn.Parameter(master.to(torch.bfloat16))
    return master


def boxes_from_raw(raw: torch.Tensor, image_size: int) -> torch.Tensor:
    """Top-left in [0, S-1] and size in [0, S-1], both sigmoid-scaled: always a valid box.

    Runs in the head's dtype (bf16 under autocast): the loss gets native-dtype boxes.
    """
    scale = image_size - 1
    top_left = torch.sigmoid(raw[..., :2]) * scale
    size = torch.sigmoid(raw[..., 2:]) * scale
    return torch.cat([top_left, top_left + size], dim=-1)
