"""Checkpoints written atomically (temporary file, fsync, rename) and read safely
(`torch.load(weights_only=True)`: tensors and plain containers only, no code)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import torch

from vitkit.errors import CheckpointError


def save_atomic(state: dict[str, Any], path: str | Path) -> Path:
    """Write `state` to `path` so that a crash leaves either the old file or the new one."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    handle, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(handle, "wb") as stream:
            torch.save(state, stream)
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load_checkpoint(path: str | Path) -> dict[str, Any]:
    """Read a checkpoint written by `save_atomic`, refusing anything that would run code."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # torch raises several types for truncated or foreign files
        raise CheckpointError(
            f"cannot read checkpoint {path}: {exc}. It may be truncated or not a vitkit "
            "checkpoint; pickles that run code are refused.") from exc
