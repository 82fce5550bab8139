"""The workload's detector, as the case study's post built it: four conv blocks, two linear
layers, and a head that maps its output to valid pixel-space boxes (the original's could
have x2 < x1). The speed-ups transform it once built. Its design in full: docs/design.md."""

import torch
from torch import nn


class Pixels(nn.Module):
    """uint8 pixels [B, 1, S, S] -> floats in [0, 1]."""

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return images.float() * (1.0 / 255.0)


# The conv blocks' names, in order: a speed-up names the block it swaps (BoxNet.block).
BLOCKS = ("first", "second", "third", "fourth")


def conv_block(c_in: int, c_out: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(c_in, c_out, 3, padding="same"), nn.MaxPool2d(2),
                         nn.ReLU())


class BoxNet(nn.Module):
    def __init__(self, image_size: int = 256, capacity: int = 256, hidden: int = 16384):
        super().__init__()
        if image_size % 16:
            raise ValueError(f"image size {image_size} must be a multiple of 16 "
                             "(four 2x2 max-pools)")
        self.pixels = Pixels()
        self.features = nn.Sequential(*(conv_block(4 ** i, 4 ** (i + 1)) for i in range(4)))
        self.lin1 = nn.Linear(256 * (image_size // 16) ** 2, hidden)
        self.lin2 = nn.Linear(hidden, capacity * 4)
        self.image_size = image_size
        self.capacity = capacity

    def block(self, name: str) -> nn.Sequential:
        """A conv block by its name in BLOCKS."""
        return self.features[BLOCKS.index(name)]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 [B, 1, S, S] -> boxes [B, capacity, 4] as (x1, y1, x2, y2) pixels."""
        raw = self.head(self.flat_features(images)).view(-1, self.capacity, 4)
        return boxes_from_raw(raw, self.image_size)

    def flat_features(self, images: torch.Tensor) -> torch.Tensor:
        """The conv blocks' output flattened for lin1: [B, 256 * (S/16)^2]. A method of its
        own so that a model whose head cannot be compiled compiles this part alone
        (model/build.py)."""
        return self.features(self.pixels(images)).flatten(1)

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """lin1, ReLU, lin2 on the flattened features."""
        return self.lin2(torch.relu(self.lin1(x)))


def boxes_from_raw(raw: torch.Tensor, image_size: int) -> torch.Tensor:
    """Top-left in [0, S-1] and size in [0, S-1], both sigmoid-scaled: always a valid box.

    Runs in the head's dtype (bf16 under autocast): the loss gets native-dtype boxes.
    """
    scale = image_size - 1
    top_left = torch.sigmoid(raw[..., :2]) * scale
    size = torch.sigmoid(raw[..., 2:]) * scale
    return torch.cat([top_left, top_left + size], dim=-1)
