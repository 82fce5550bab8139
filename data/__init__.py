"""Where the batches come from: a synthetic face dataset and the collates that shape its
ragged targets (a list of per-sample tensors; padded slots plus per-sample counts; or
every box packed into one tensor with its image, slot and per-image offsets)."""

from data.collate import (
    check_capacity,
    collate_list,
    collate_packed,
    collate_padded,
)
from data.synthetic import MAX_BOXES_PER_IMAGE, SyntheticFaces

__all__ = ["SyntheticFaces", "MAX_BOXES_PER_IMAGE", "collate_list", "collate_padded",
           "collate_packed", "check_capacity"]
