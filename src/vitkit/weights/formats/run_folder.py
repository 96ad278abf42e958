"""A training run's output folder (`vitkit train --out runs/x`) read as its best weights:
best.pt, else last.pt. A folder with a config.json is a model folder, not a run."""

from __future__ import annotations

import logging
from pathlib import Path

from vitkit.weights.formats import train_checkpoint
from vitkit.weights.formats.base import ReadOptions
from vitkit.weights.formats.sniff import Found
from vitkit.weights.record import WeightsRecord

log = logging.getLogger("vitkit.weights")
RUN_FILES = ("best.pt", "last.pt")  # in order of preference


def detect(found: Found) -> bool:
    return found.kind == "folder" and found.config() is None and \
        any((found.path / name).is_file() for name in RUN_FILES)


def is_run_folder(path: Path) -> bool:
    """Whether `path` is a run's folder: best.pt or last.pt, and no config.json."""
    return path.is_dir() and detect(Found.at(path))


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    path = next(found.path / name for name in RUN_FILES if (found.path / name).is_file())
    log.info("%s is a run folder: using %s", found.path, path.name)
    return train_checkpoint.read(Found.at(path), options)
