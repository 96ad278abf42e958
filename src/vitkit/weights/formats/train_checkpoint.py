"""vitkit's training checkpoint (last.pt, best.pt): a weights record plus the run's state.

On disk one flat dict written with `torch.save` (atomically) and read with
`torch.load(weights_only=True)`:

    format        "vitkit-train-2" ("vitkit-train-1" files still read and resume)
    model_config  the model config at the resolution the tensors have
    preprocess    `Preprocess.to_dict()`, at the run's final resolution (v1: img_size/mean/std)
    classes       class names of the training data
    weights       "raw" or "ema": which weights scored at the last evaluation; the record
                  (`TrainCheckpoint.record`) holds those
    model, ema    the raw weights and the `AveragedModel` state (EMA off: None)
    optimizer, position, history, rng, train_config: what resuming needs
    checksum      sha256 of the model and EMA tensors (`vitkit.weights.checksum`), checked on
                  reading; files written before it existed read unchecked

Both the raw model and the EMA are kept whatever `weights` says, so a resume is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitkit.config import ViTConfig
from vitkit.errors import CheckpointError, ConfigError, VitkitError
from vitkit.files import write_atomic
from vitkit.preprocess import Preprocess
from vitkit.weights.checksum import tensors_checksum, verify_checksum
from vitkit.weights.formats.base import ReadOptions
from vitkit.weights.formats.sniff import Found
from vitkit.weights.record import WEIGHT_KINDS, WeightsRecord, check_config_fits

FORMAT = "vitkit-train-2"
READABLE_FORMATS = ("vitkit-train-1", FORMAT)
_EMA_PREFIX = "module."  # AveragedModel keeps the averaged model as `module`


@dataclass
class Position:
    """Where training stands: the next batch to run is (epoch, batch); `step` counts updates."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    total_steps: int = 0
    best_top1: float = -1.0
    elapsed: float = 0.0  # training wall time before this process started
    history: list[dict[str, float]] = field(default_factory=list)


@dataclass
class TrainCheckpoint:
    """One training checkpoint: the record's parts and the run state, typed."""

    config: ViTConfig
    preprocess: Preprocess
    class_names: list[str]
    model: dict[str, torch.Tensor]
    ema: dict[str, Any] | None
    optimizer: dict[str, Any]
    position: Position
    torch_rng: torch.Tensor
    augment_rng: torch.Tensor
    train_config: dict[str, Any]
    weights: str = "raw"
    format: str = FORMAT

    def scored_state_dict(self) -> dict[str, torch.Tensor]:
        """The weights `weights` names: the raw ones, or the EMA's averaged ones."""
        if self.weights == "raw":
            return self.model
        if self.ema is None:
            raise CheckpointError("the checkpoint says its weights are the EMA's but holds no "
                                  "EMA state: it is damaged; use the other checkpoint of the run")
        return {k[len(_EMA_PREFIX):]: v for k, v in self.ema.items()
                if k.startswith(_EMA_PREFIX)}

    def record(self, path: Path | None = None) -> WeightsRecord:
        try:
            weights = self.scored_state_dict()
        except CheckpointError as exc:
            raise CheckpointError(f"{path}: {exc}") from None
        return WeightsRecord(self.config, weights,
                             self.preprocess.replace(img_size=list(self.config.img_size)),
                             "vitkit-train", list(self.class_names) or None,
                             extra={"train_config": self.train_config}, weights=self.weights,
                             path=path)

    def to_state(self) -> dict[str, Any]:
        pos = self.position
        return {
            "format": FORMAT, "model_config": self.config.to_dict(),
            "preprocess": self.preprocess.to_dict(), "classes": list(self.class_names),
            "weights": self.weights, "model": self.model, "ema": self.ema,
            "optimizer": self.optimizer,
            "position": {"epoch": pos.epoch, "batch": pos.batch, "step": pos.step,
                         "total_steps": pos.total_steps, "best_top1": pos.best_top1,
                         "elapsed": pos.elapsed},
            "history": pos.history,
            "rng": {"torch": self.torch_rng, "augment": self.augment_rng},
            "train_config": self.train_config,
            "checksum": tensors_checksum(_checked_tensors(self.model, self.ema)),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], path: str | Path) -> TrainCheckpoint:
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
        try:
            config = ViTConfig.from_dict(state["model_config"])
            check_config_fits(config, state["model"], path)
            pos = state["position"]
            return cls(
                config, _preprocess(state.get("preprocess") or {}, config),
                list(state.get("classes") or []), state["model"], state.get("ema"),
                state["optimizer"],
                Position(pos["epoch"], pos["batch"], pos["step"], pos["total_steps"],
                         pos["best_top1"], pos["elapsed"], list(state["history"])),
                state["rng"]["torch"], state["rng"]["augment"], state.get("train_config") or {},
                state.get("weights", "raw"), version)
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


# -- files ----------------------------------------------------------------------------------------
def save_atomic(state: dict[str, Any], path: str | Path) -> Path:
    """Write `state` to `path` so that a crash leaves either the old file or the new one
    (temporary file beside it, fsync, rename)."""
    return write_atomic(path, lambda stream: torch.save(state, stream), fsync=True)


def write(checkpoint: TrainCheckpoint, path: str | Path) -> Path:
    """Save `checkpoint` atomically."""
    return save_atomic(checkpoint.to_state(), path)


def load_state(path: str | Path) -> dict[str, Any]:
    """The raw dict of a checkpoint file, read safely (tensors and containers only)."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    found = Found.at(path)
    if found.kind != "torch":
        what = {"folder": "a folder", "npz": "an .npz file", "safetensors": "a safetensors "
                "file"}.get(found.kind, "not a PyTorch file")
        raise CheckpointError(f"{path} is not a vitkit training checkpoint ({what}): pass the "
                              "last.pt or best.pt that `vitkit train` wrote")
    state = found.contents()
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a vitkit training checkpoint")
    return state


def read_checkpoint(path: str | Path) -> TrainCheckpoint:
    """A training checkpoint with everything resuming needs."""
    return TrainCheckpoint.from_state(load_state(path), path)


# -- the adapter ----------------------------------------------------------------------------------
def detect(found: Found) -> bool:
    if found.kind != "torch":
        return False
    state = found.contents()
    return isinstance(state, dict) and "model_config" in state and "model" in state


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    return TrainCheckpoint.from_state(found.contents(), found.path).record(found.path)
