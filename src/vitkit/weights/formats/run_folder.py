"""A training run's output folder (`vitkit train --out runs/x`) read as its best weights:
best.pt, else last.pt. A folder with a config.json is a model folder, not a run."""

from __future__ import annotations

import logging
from pathlib import Path

from vitkit.errors import CheckpointError
from vitkit.weights.formats import train_checkpoint
from vitkit.weights.formats.base import ReadOptions
from vitkit.weights.formats.sniff import Found
from vitkit.weights.record import WeightsRecord

log = logging.getLogger("vitkit.weights")
RUN_FILES = ("best.pt", "last.pt")  # in order of preference
_KIND_WORDS = {"torch": "a PyTorch file of other contents", "safetensors": "a safetensors file",
               "npz": "an .npz archive"}


def detect(found: Found) -> bool:
    return found.kind == "folder" and found.config() is None and \
        any((found.path / name).is_file() for name in RUN_FILES)


def is_run_folder(path: Path) -> bool:
    """Whether `path` is a run's folder: best.pt or last.pt, and no config.json."""
    return path.is_dir() and detect(Found.at(path))


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    present = [found.path / name for name in RUN_FILES if (found.path / name).is_file()]
    log.info("%s is a run folder: using %s", found.path, present[0].name)
    try:
        return _read_checkpoint(present[0], options)
    except CheckpointError as exc:
        if len(present) == 1:
            raise
        raise CheckpointError(f"{exc} (the run's {present[1].name} may be whole: pass it "
                              f"instead, {present[1]})") from None


def _read_checkpoint(path: Path, options: ReadOptions) -> WeightsRecord:
    """A run's checkpoint; one emptied or replaced by another kind of file (an export
    written over it) is refused as such, not read as whatever it now holds."""
    if path.stat().st_size == 0:
        raise CheckpointError(f"{path} is empty, which a run's checkpoint never is (it is "
                              "written whole or not at all): it was truncated or replaced")
    checkpoint = Found.at(path)
    if not train_checkpoint.detect(checkpoint):
        holds = _KIND_WORDS.get(checkpoint.kind, "bytes of no format vitkit reads")
        raise CheckpointError(f"{path} is not a vitkit training checkpoint (it holds {holds}): "
                              "it was replaced or damaged; pass the weights file itself if it "
                              "is one, or train again")
    return train_checkpoint.read(checkpoint, options)
