"""The model part of vitkit's training checkpoints (last.pt, best.pt): what
`load_pretrained("runs/x/best.pt")` reads.

A training checkpoint is one flat dict written with `torch.save` (atomically) and read with
`torch.load(weights_only=True)`. Its model part, read and written here:

    format        "vitkit-train-2" ("vitkit-train-1" files still read and resume)
    model_config  the model config at the resolution the tensors have
    preprocess    `Preprocess.to_dict()`, at the run's final resolution (v1: img_size/mean/std)
    classes       class names of the training data (regression / multi-label: the target or
                  label names)
    task          `TaskSpec.to_dict()`: the task, its loss and target standardisation
                  (absent or None in older files: classification)
    weights       "raw" or "ema": which weights scored at the last evaluation; the record
                  (`TrainedWeights.record`) holds those
    model, ema    the raw weights and the `AveragedModel` state (EMA off: None)
    checksum      sha256 of the model and EMA tensors (`vitkit.weights.checksum`), checked on
                  reading; files without one read unchecked

Both the raw model and the EMA are kept whatever `weights` says, so a resume is exact. The
rest of the file (optimizer, position, history, rng, train_config: what resuming needs) is
training's: `vitkit.train.checkpoint`.
"""

from __future__ import annotations

import logging
import os
import shlex
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from vitkit.config import ViTConfig
from vitkit.errors import CheckpointError, ConfigError, VitkitError
from vitkit.preprocess import Preprocess
from vitkit.tasks import TaskSpec
from vitkit.weights.checksum import tensors_checksum, verify_checksum
from vitkit.weights.formats.base import ReadOptions
from vitkit.weights.formats.sniff import Found
from vitkit.weights.record import WEIGHT_KINDS, WeightsRecord, check_config_fits

log = logging.getLogger("vitkit.weights")

FORMAT = "vitkit-train-2"
READABLE_FORMATS = ("vitkit-train-1", FORMAT)
_EMA_PREFIX = "module."  # AveragedModel keeps the averaged model as `module`


@dataclass
class TrainedWeights:
    """The model part of a training checkpoint, typed."""

    config: ViTConfig
    preprocess: Preprocess
    class_names: list[str]
    model: dict[str, torch.Tensor]
    ema: dict[str, Any] | None
    weights: str = "raw"
    format: str = FORMAT
    task: TaskSpec | None = None  # None: classification (files that store no task)

    def scored_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights `weights` names: the raw ones, or the EMA's averaged ones."""
        if self.weights == "raw":
            return self.model
        if self.ema is None:
            raise CheckpointError("the checkpoint says its weights are the EMA's but holds no "
                                  "EMA state: it is damaged; use the other checkpoint of the run")
        return {k[len(_EMA_PREFIX):]: v for k, v in self.ema.items()
                if k.startswith(_EMA_PREFIX)}

    def record(self, path: Path | None = None, train_config: dict[str, Any] | None = None,
               trained_in: str | None = None) -> WeightsRecord:
        """The weights that scored, as a record (`train_config`: the run's recipe;
        `trained_in`: the working folder it trained in)."""
        try:
            weights = self.scored_state_dict()
        except CheckpointError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        extra = {"train_config": train_config or {}, "trained_in": trained_in}
        return WeightsRecord(self.config, weights,
                             self.preprocess.replace(img_size=list(self.config.img_size)),
                             "vitkit-train", list(self.class_names) or None, extra=extra,
                             weights=self.weights, path=path, task=self.task)

    def to_state(self) -> dict[str, Any]:
        """The model part's entries of the file, in the file's order (the checksum, which
        comes last, is `checksum()`)."""
        return {"format": FORMAT, "model_config": self.config.to_dict(),
                "preprocess": self.preprocess.to_dict(), "classes": list(self.class_names),
                "weights": self.weights,
                "task": self.task.to_dict() if self.task is not None else None,
                "model": self.model, "ema": self.ema}

    def checksum(self) -> str:
        return tensors_checksum(_checked_tensors(self.model, self.ema))

    @classmethod
    def from_state(cls, state: dict[str, Any], path: str | Path) -> TrainedWeights:
        version = state.get("format")
        if version not in READABLE_FORMATS:
            raise CheckpointError(f"{path} is not a vitkit training checkpoint (format "
                                  f"{version!r}; this vitkit reads {', '.join(READABLE_FORMATS)})")
        if state.get("weights", "raw") not in WEIGHT_KINDS:
            raise CheckpointError(f"{path} says its weights are {state['weights']!r}, not one of "
                                  f"{', '.join(WEIGHT_KINDS)}: it is damaged; use the run's "
                                  "other checkpoint or train again")
        if "checksum" in state:
            try:
                tensors = _checked_tensors(state.get("model"), state.get("ema"))
            except (TypeError, AttributeError):
                tensors = {}
            verify_checksum(tensors, state["checksum"], path, "model and EMA tensors")
        with damaged_unless_readable(path):
            config = ViTConfig.from_dict(state["model_config"])
            check_config_fits(config, state["model"], path)
            task = state.get("task")
            return cls(config, _preprocess(state.get("preprocess") or {}, config),
                       list(state.get("classes") or []), state["model"], state.get("ema"),
                       state.get("weights", "raw"), version,
                       TaskSpec.from_dict(dict(task)) if task is not None else None)


@contextmanager
def damaged_unless_readable(path: str | Path) -> Iterator[None]:
    """Reading a training checkpoint's entries: a missing entry or one of the wrong form is
    a `CheckpointError` that says the file is damaged and what to do."""
    try:
        yield
    except KeyError as exc:
        raise CheckpointError(f"{path} is a vitkit training checkpoint without "
                              f"{exc.args[0]!r}: it is damaged; use the run's other "
                              "checkpoint or train again") from exc
    except (ConfigError, TypeError, ValueError, AttributeError, IndexError) as exc:
        if isinstance(exc, VitkitError) and not isinstance(exc, ConfigError):
            raise
        raise CheckpointError(f"{path} is a vitkit training checkpoint whose contents have "
                              f"the wrong form ({type(exc).__name__}: {exc}): it is damaged; "
                              "use the run's other checkpoint or train again") from None


def _checked_tensors(model: Any, ema: Any) -> dict[str, torch.Tensor]:
    """The tensors the checksum covers: the raw weights and the EMA's state."""
    tensors = {f"model.{k}": v for k, v in model.items()}
    if ema is not None:
        tensors.update({f"ema.{k}": v for k, v in ema.items() if isinstance(v, torch.Tensor)})
    if not all(isinstance(v, torch.Tensor) for v in tensors.values()):
        raise TypeError("the model weights are not all tensors")
    return tensors


def _preprocess(saved: dict[str, Any], config: ViTConfig) -> Preprocess:
    """v2 stores the whole `Preprocess`; v1 stored img_size/mean/std (read as v1 did)."""
    if "resize_mode" in saved:
        return Preprocess.from_dict(saved)
    channels = (0.5,) * config.in_chans
    return Preprocess(img_size=saved.get("img_size") or config.img_size, interpolation="bicubic",
                      mean=saved.get("mean") or channels, std=saved.get("std") or channels)


# -- the adapter ----------------------------------------------------------------------------------
def detect(found: Found) -> bool:
    if found.kind != "torch":
        return False
    state = found.contents()
    return isinstance(state, dict) and "model_config" in state and "model" in state


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    state = found.contents()
    return TrainedWeights.from_state(state, found.path).record(
        found.path, state.get("train_config"), state.get("trained_in"))


def data_dir_from_here(recipe: dict[str, Any] | None, checkpoint: str | Path | None,
                       data_option: str | None = "--data-dir",
                       trained_in: str | None = None) -> dict[str, Any] | None:
    """`recipe` (the train_config of the run that wrote `checkpoint`) with a relative
    `data_dir` read from the folder the run was trained in: the run folder less its relative
    `out_dir` (runs/pets/best.pt with out_dir=runs/pets: the folder holding runs/), else
    `trained_in`, the working folder the checkpoint recorded (an absolute out_dir, a moved
    run), logged. So `vitkit eval runs/pets` reads the run's data from any folder, and a
    folder of the same name in the working folder is not taken for it (a warning names it
    and how to read it: `data_option`, the caller's flag for a data folder; None where there
    is none). Kept as recorded when neither holds the data; then the data's own error says
    where it was looked for. No recipe (weights that are not a vitkit run's): returned as it
    is."""
    if not recipe:
        return recipe
    data_dir = recipe.get("data_dir")
    if checkpoint is None or not isinstance(data_dir, str):
        return recipe
    data = Path(data_dir).expanduser()
    if data.is_absolute():
        return recipe
    found = next((folder for folder in (_training_folder(recipe.get("out_dir"), checkpoint),
                                        trained_in if isinstance(trained_in, str) else None)
                  if folder is not None and (Path(folder) / data).exists()), None)
    if found is None or _same_file(data, Path(found) / data):
        return recipe
    found = Path(found) / data
    if data.exists():
        other = f"the working folder's {data_dir} is another folder"
        log.warning("data_dir=%s: read from %s, the folder the run trained in; %s", data_dir,
                    found, f"{other} (to read that one instead, give it as the data folder: "
                           f"{data_option} {shlex.quote(os.path.abspath(data))})"
                    if data_option else f"{other}, not read")
    else:
        log.info("data_dir=%s, relative to the folder the run trained in: read from %s",
                 data_dir, found)
    return {**recipe, "data_dir": str(found)}


def _training_folder(out_dir: Any, checkpoint: str | Path) -> Path | None:
    """The folder a run trained in, told from where its checkpoint is now: the run folder
    less its relative `out_dir`; None when that cannot be told (an absolute out_dir, one
    with "..", a run moved to a folder of another name)."""
    if not isinstance(out_dir, str):
        return None
    out = Path(out_dir)
    if out.is_absolute() or ".." in out.parts:
        return None
    run = Path(os.path.abspath(checkpoint))  # symlinks kept, as the user named the run
    run = run if run.is_dir() else run.parent
    depth = len(out.parts)  # 0 for out_dir=".": the run folder is the training folder
    if depth and run.parts[-depth:] != out.parts:
        return None
    return run.parents[depth - 1] if depth else run


def _same_file(first: Path, second: Path) -> bool:
    """Whether both paths are one file or folder (False when either is missing)."""
    try:
        return os.path.samefile(first, second)
    except OSError:
        return False
