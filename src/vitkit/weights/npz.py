"""Moved to `vitkit.weights.formats.npz`; this name stays for existing imports."""

from vitkit.errors import CheckpointFormatError
from vitkit.weights.formats.npz import (
    LAYOUTS,
    convert_npz,
    is_official_npz,
    layout_of,
    read_npz,
    save_npz,
    to_official_arrays,
)

__all__ = ["LAYOUTS", "CheckpointFormatError", "convert_npz", "is_official_npz", "layout_of",
           "read_npz", "save_npz", "to_official_arrays"]
