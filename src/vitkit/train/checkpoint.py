"""A training run's checkpoints (last.pt, best.pt): what they hold, writing them atomically,
and reading them back to resume.

One flat dict (`torch.save`, read with `weights_only=True`): the model part that
`vitkit.weights.formats.train_checkpoint` reads for `load_pretrained` (format, model_config,
preprocess, classes, weights, model, ema, checksum), and what resuming needs:

    optimizer     the optimizer's state dict
    position      epoch, batch, step, total_steps, best_score (the best of the task's primary
                  metric so far: top-1, R^2 or mAP; older files: best_top1), elapsed
    history       one row per evaluation (what metrics.jsonl holds)
    rng           {"torch": the global RNG state, "augment": the augmentation generator's}
    train_config  the run's recipe (`TrainConfig.to_dict()`)
    trained_in    the absolute working folder the run trained in, from which a relative
                  data_dir was read (older files: absent)
    trained_as    {"precision": "bf16" or "fp32", "device": the device type ("cpu", "cuda",
                  ...)}: what the run trained in, so a resume with amp=auto on that kind of
                  device keeps it (older files: absent, and amp=auto decides again)
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitkit.errors import CheckpointError, TrainingError
from vitkit.files import out_of_room_message, write_atomic
from vitkit.weights.formats.run_folder import CHECKPOINTS, LAST, way_out
from vitkit.weights.formats.sniff import Found
from vitkit.weights.formats.train_checkpoint import TrainedWeights, damaged_unless_readable


@dataclass
class Position:
    """Where training stands: the next batch to run is (epoch, batch); `step` counts updates."""

    epoch: int = 0
    batch: int = 0
    step: int = 0
    total_steps: int = 0
    best_score: float | None = None  # the task's primary metric at best.pt (None: no best yet)
    elapsed: float = 0.0  # training wall time before this process started
    history: list[dict[str, float]] = field(default_factory=list)
    # the epoch in progress so far, over every rank: its training loss summed over images and
    # the images, so a run resumed mid-epoch reports the whole epoch's train_loss
    epoch_loss: float = 0.0
    epoch_images: int = 0
    # batches per epoch of the data the run drew from (0: unknown, a file without it),
    # so a resume over data of another length counts the epochs left in its batches
    batches_per_epoch: int = 0


@dataclass
class TrainCheckpoint:
    """One training checkpoint: the model part (`trained`) and the run state, typed."""

    trained: TrainedWeights
    optimizer: dict[str, Any]
    position: Position
    torch_rng: torch.Tensor
    augment_rng: torch.Tensor
    train_config: dict[str, Any]
    trained_in: str | None = None
    trained_as: dict[str, str] | None = None

    def to_state(self) -> dict[str, Any]:
        pos = self.position
        return {
            **self.trained.to_state(),
            "optimizer": self.optimizer,
            "position": {"epoch": pos.epoch, "batch": pos.batch, "step": pos.step,
                         "total_steps": pos.total_steps, "best_score": pos.best_score,
                         "elapsed": pos.elapsed, "epoch_loss": pos.epoch_loss,
                         "epoch_images": pos.epoch_images,
                         "batches_per_epoch": pos.batches_per_epoch},
            "history": pos.history,
            "rng": {"torch": self.torch_rng, "augment": self.augment_rng},
            "train_config": self.train_config,
            "trained_in": self.trained_in,
            "trained_as": self.trained_as,
            "checksum": self.trained.checksum(),
        }

    @classmethod
    def from_state(cls, state: dict[str, Any], path: str | Path) -> TrainCheckpoint:
        trained = TrainedWeights.from_state(state, path)
        with damaged_unless_readable(path):
            pos = state["position"]
            return cls(trained, state["optimizer"],
                       Position(pos["epoch"], pos["batch"], pos["step"], pos["total_steps"],
                                _best_score(pos), pos["elapsed"], list(state["history"]),
                                float(pos.get("epoch_loss", 0.0)),
                                int(pos.get("epoch_images", 0)),
                                int(pos.get("batches_per_epoch", 0))),
                       state["rng"]["torch"], state["rng"]["augment"],
                       state.get("train_config") or {}, _text(state.get("trained_in")),
                       _trained_as(state.get("trained_as")))


def _text(value: Any) -> str | None:
    """A text entry of the file, or None (absent, or not text in a damaged file)."""
    return value if isinstance(value, str) else None


def _trained_as(value: Any) -> dict[str, str] | None:
    """The precision and device a checkpoint trained in, or None (absent, or not as written)."""
    if (isinstance(value, dict) and value.get("precision") in ("bf16", "fp32")
            and isinstance(value.get("device"), str)):
        return {"precision": value["precision"], "device": value["device"]}
    return None


def _best_score(position: dict[str, Any]) -> float | None:
    """The best score a checkpoint records; files that store no task keep top-1 as
    "best_top1", -1 for none yet."""
    if "best_score" in position:
        return position["best_score"]
    best = position["best_top1"]
    return None if best < 0 else best


# -- files ----------------------------------------------------------------------------------------
def save_atomic(state: dict[str, Any], path: str | Path) -> Path:
    """Write `state` to `path` so that a crash leaves either the old file or the new one
    (temporary file beside it, fsync, rename); a full disk is `room_to_write`'s error."""
    with room_to_write(path, needed=tensor_bytes(state)):
        return write_atomic(path, lambda stream: torch.save(state, stream), fsync=True)


@contextmanager
def room_to_write(path: str | Path, needed: int | None = None) -> Iterator[None]:
    """Write `path`, a file of a run folder (or the folder, for any file in it, named by the
    error where it names one): a full disk or a spent quota (from the write,
    the fsync or the rename) is a `TrainingError` of one line that names the file, the room
    left and `needed` (bytes, when known), what is kept (the previous checkpoint: an atomic
    write leaves it whole) and how to go on (free space, or another run folder)."""
    path = Path(path)
    try:
        yield
    except OSError as exc:
        last = (path if path.is_dir() else path.parent) / LAST
        kept = []
        if path.name in CHECKPOINTS:
            kept.append(f"the previous {path.name} is kept, whole" if path.exists() else
                        f"no {path.name} was written")
        if path.name != LAST and last.is_file():
            kept.append(f"{last.name} keeps the run as last saved")
        fix = (f"free space there and continue with --resume {last}, or continue in a run "
               f"folder on a disk with room: --resume {last} --out OTHER_FOLDER"
               if last.is_file() else "free space there, or point the run folder elsewhere "
               "(--out OTHER_FOLDER), and train again")
        named = Path(exc.filename) if path.is_dir() and exc.filename else path  # not a .tmp
        message = out_of_room_message(exc, named, needed, "; ".join(kept), fix)
        if message is None:
            raise
        raise TrainingError(message) from None


def tensor_bytes(state: Any) -> int:
    """The bytes of the tensors in `state` (nested dicts and lists): about what its file
    needs on disk."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(tensor_bytes(value) for value in state.values())
    if isinstance(state, (list, tuple)):
        return sum(tensor_bytes(value) for value in state)
    return 0


def write(checkpoint: TrainCheckpoint, path: str | Path) -> Path:
    """Save `checkpoint` atomically."""
    return save_atomic(checkpoint.to_state(), path)


def resume_path(path: str | Path) -> Path:
    """The checkpoint a path names for resuming: a file, or a run folder's last.pt."""
    path = Path(path)
    return path / LAST if path.is_dir() and (path / LAST).is_file() else path


def load_state(path: str | Path) -> dict[str, Any]:
    """The raw dict of a checkpoint file (or a run folder's last.pt), read safely (tensors
    and containers only)."""
    path = resume_path(path)
    if path.is_dir():
        raise CheckpointError(f"{path} holds no last.pt: pass a run folder (one that `vitkit "
                              "train` wrote) or a checkpoint file (its last.pt or best.pt)")
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path} does not exist")
    try:
        found = Found.at(path)
        state = found.contents() if found.kind == "torch" else None
    except CheckpointError as exc:  # a damaged last.pt: resume from the run's best.pt
        raise way_out(exc, path, resuming=True) from None
    if found.kind != "torch":
        what = {"folder": "a folder", "npz": "an .npz file", "safetensors": "a safetensors "
                "file"}.get(found.kind, "not a PyTorch file")
        raise CheckpointError(f"{path} is not a vitkit training checkpoint ({what}): pass the "
                              "last.pt or best.pt that `vitkit train` wrote")
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} is not a vitkit training checkpoint")
    return state


def read_checkpoint(path: str | Path) -> TrainCheckpoint:
    """A training checkpoint with everything resuming needs."""
    return TrainCheckpoint.from_state(load_state(path), path)
