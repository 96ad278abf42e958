"""A training run's output folder (`vitkit train --out runs/x`): the files a run writes there
(`RUN_FILES`, `RUN_FOLDERS`: the one list of them, which the training side asks too), and the
folder read as its best weights: best.pt, else last.pt. A folder with a config.json is a model
folder, not a run."""

from __future__ import annotations

import logging
from pathlib import Path

from vitkit.errors import CheckpointError
from vitkit.weights.formats import train_checkpoint
from vitkit.weights.formats.base import AGAIN, ReadOptions, with_fix
from vitkit.weights.formats.sniff import Found
from vitkit.weights.record import WeightsRecord

log = logging.getLogger("vitkit.weights")
# The names of a run's files: spelled here only; the writers (vitkit.train, data.skipped) import
# them (tests/project/test_layout.py checks it).
LAST, BEST, DIVERGED = "last.pt", "best.pt", "diverged.pt"
METRICS_JSONL, METRICS_CSV, LEARNING_CURVE = "metrics.jsonl", "metrics.csv", "learning_curve.png"
SKIPPED_FILES = "skipped_files.txt"
TENSORBOARD = "tensorboard"
CHECKPOINTS = (LAST, BEST, DIVERGED)  # each written whole: `.{name}.XXXX.tmp`, then renamed
WEIGHTS_FILES = (BEST, LAST)  # the checkpoints read as the run's weights, in order of preference
RUN_FILES = (*CHECKPOINTS, METRICS_JSONL, METRICS_CSV, LEARNING_CURVE,
             SKIPPED_FILES)  # every file a run writes in its folder
RUN_FOLDERS = (TENSORBOARD,)  # and every folder
_KIND_WORDS = {"torch": "a PyTorch file of other contents", "safetensors": "a safetensors file",
               "npz": "an .npz archive"}


def detect(found: Found) -> bool:
    return found.kind == "folder" and found.config() is None and \
        any((found.path / name).is_file() for name in WEIGHTS_FILES)


def is_run_folder(path: Path) -> bool:
    """Whether `path` is a run's folder: best.pt or last.pt, and no config.json."""
    return path.is_dir() and detect(Found.at(path))


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    present = [found.path / name for name in WEIGHTS_FILES if (found.path / name).is_file()]
    log.info("%s is a run folder: using %s", found.path, present[0].name)
    try:
        return _read_checkpoint(present[0], options)
    except CheckpointError as exc:
        if len(present) == 1:
            raise
        raise CheckpointError(f"{exc} (the run's {present[1].name} may be whole: pass it "
                              f"instead, {present[1]})") from None


def other_checkpoint(path: str | Path) -> Path | None:
    """The run's other checkpoint beside `path`: best.pt beside last.pt, last.pt beside
    best.pt; None when `path` is neither, or the other is not a file there."""
    path = Path(path)
    other = {LAST: BEST, BEST: LAST}.get(path.name)
    return path.with_name(other) if other and path.with_name(other).is_file() else None


def way_out(error: CheckpointError, path: str | Path, resuming: bool = False) -> CheckpointError:
    """`error`, a damaged run checkpoint `path` (`base.damaged`'s), with the way out that
    its run folder holds in place of "download or copy it again": the run's other checkpoint
    when it reads as one (`resuming`: how to resume from it), else training again. Another
    error, or a file that is no run's checkpoint, as it is."""
    other = other_checkpoint(path)
    if other is None or not str(error).endswith(AGAIN):
        return error
    try:
        whole = train_checkpoint.detect(Found.at(other))
    except CheckpointError:
        whole = False
    if not whole:
        return with_fix(error, f"the run's {other.name} is damaged too: train again "
                               f"(--overwrite, or another --out)")
    if not resuming:
        return with_fix(error, f"the run's {other.name} is whole: pass it instead, {other}")
    since = " (it goes back to the run's best evaluation)" if other.name == BEST else ""
    return with_fix(error, f"resume from the run's {other.name}, which is whole: "
                           f"--resume {other}{since}")


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
