"""Moved: training checkpoints are written and read by
`vitkit.weights.formats.train_checkpoint` (atomic write, safe read); these names stay."""

from vitkit.errors import CheckpointError
from vitkit.weights.formats.train_checkpoint import load_state as load_checkpoint
from vitkit.weights.formats.train_checkpoint import save_atomic

__all__ = ["CheckpointError", "load_checkpoint", "save_atomic"]
