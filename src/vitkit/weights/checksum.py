"""Checksums of state dicts: what vitkit's own files store to tell a damaged file from a good one.

One sha256 over every tensor's name, dtype, shape and bytes, in sorted name order (one pass
over the data). vitkit folders keep it in config.json, training checkpoints in the file;
files without one (older or third-party) are read unchecked.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from pathlib import Path

import torch

from vitkit.weights.formats.base import damaged

ALGORITHM = "sha256"


def tensors_checksum(tensors: Mapping[str, torch.Tensor]) -> str:
    """sha256 (hex) of the tensors' names, dtypes, shapes and bytes, in sorted name order."""
    digest = hashlib.sha256()
    for name in sorted(tensors):
        tensor = tensors[name].detach().cpu().contiguous()
        digest.update(f"{name}|{tensor.dtype}|{tuple(tensor.shape)}\n".encode())
        digest.update(tensor.reshape(-1).view(torch.uint8).numpy().data)
    return digest.hexdigest()


def verify_checksum(tensors: Mapping[str, torch.Tensor], expected: object,
                    path: str | Path, what: str = "tensors") -> None:
    """Raise a CheckpointError when the stored checksum `expected` does not match."""
    if not isinstance(expected, str) or tensors_checksum(tensors) != expected:
        raise damaged(path, f"the {what} do not match the {ALGORITHM} checksum stored when it "
                            "was written")
