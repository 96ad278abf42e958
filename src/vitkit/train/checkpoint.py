"""Checkpoints written atomically (temporary file, fsync, rename) and read safely
(`torch.load(weights_only=True)`: tensors and plain containers only, no code)."""

from __future__ import annotations

import os
import pickle
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
        # torch's own text advises weights_only=False, which would run the file's code: unsafe.
        reason = "not a PyTorch file, or one holding objects that would run code" \
            if isinstance(exc, pickle.UnpicklingError) else \
            (str(exc).splitlines() or [type(exc).__name__])[0]
        raise CheckpointError(
            f"{path} is not a vitkit training checkpoint ({reason}). Pass the last.pt or "
            "best.pt that `vitkit train` wrote; if it is one, it is damaged or truncated.") \
            from None
