"""Where the batches come from: a synthetic face dataset and the collates that shape its
ragged targets (a list of per-sample tensors; padded slots plus per-sample counts; or
every box packed into one tensor with its image and slot, plus offsets for nested)."""

from data.collate import (
    check_capacity,
    collate_list,
    collate_nested,
    collate_packed,
    collate_padded,
)
from data.synthetic import MAX_BOXES_PER_IMAGE, SyntheticFaces

__all__ = ["SyntheticFaces", "MAX_BOXES_PER_IMAGE", "collate_list", "collate_padded",
           "collate_packed", "collate_nested", "check_capacity"]
