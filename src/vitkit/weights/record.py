"""`WeightsRecord`: weights read from disk, as every reader returns them.

A record is a model config, a vitkit state dict that fits it, the `Preprocess` its inputs
need, the class names when the file names them, the task it was trained for (`TaskSpec`;
None: classification), where it came from (`origin`) and which
weights of a run these are (`weights`). `build_model` turns one into a model;
`vitkit.weights.formats` holds one adapter per file format that reads (and writes) them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitkit.config import ViTConfig
from vitkit.errors import CheckpointError, ConfigError, long_name
from vitkit.preprocess import Preprocess, check_tta
from vitkit.tasks import TaskSpec

# `WeightsRecord.origin`: every value, and the reader that sets it. The default
# position-embedding resampling follows the origin (`vitkit.weights.resampling`).
ORIGINS: dict[str, str] = {
    "npz": "an official Google .npz, any layout (vit_jax or big_vision), or a named "
           "official checkpoint (formats/npz.py, formats/hub.py)",
    "timm": "a timm ViT state dict (.safetensors, .pth, .bin) or timm Hub folder "
            "(formats/timm.py)",
    "huggingface": "a Hugging Face ViT state dict or model folder (formats/hf.py)",
    "vitkit": "vitkit's folder: model.safetensors + config.json (formats/vitkit.py)",
    "vitkit-train": "a vitkit training checkpoint (last.pt, best.pt), or a run folder holding "
                    "them (formats/train_checkpoint.py, formats/run_folder.py)",
}

# `WeightsRecord.weights`: the model's own weights ("raw"), or their exponential moving
# average ("ema") when a training run with EMA found those scored better.
WEIGHT_KINDS = ("raw", "ema")


@dataclass
class WeightsRecord:
    """A checkpoint read and converted to vitkit's layout, before a model is built from it."""

    config: ViTConfig
    state_dict: dict[str, torch.Tensor]
    preprocess: Preprocess
    origin: str  # one of ORIGINS
    class_names: list[str] | None = None
    # "train_config", "trained_in", "eval_tta", "pos_interpolation"
    extra: dict[str, Any] = field(default_factory=dict)
    weights: str = "raw"  # one of WEIGHT_KINDS
    path: Path | None = None  # the file the tensors were read from
    # what the weights were trained for (kind, output names, loss, target standardisation);
    # None: classification, as every format but vitkit's own stores
    task: TaskSpec | None = None

    def __post_init__(self) -> None:
        if self.origin not in ORIGINS:
            raise ConfigError(f"origin={self.origin!r} is not one of {', '.join(ORIGINS)}")
        if self.weights not in WEIGHT_KINDS:
            raise ConfigError(f"weights={self.weights!r} is not one of "
                              f"{', '.join(WEIGHT_KINDS)}")
        check_tensors(self.state_dict, self.path or self.origin)
        for what, names in (("class names", self.class_names),
                            ("task's output names", self.task.names if self.task else None)):
            problem = long_name(names or ())
            if problem:
                raise CheckpointError(f"{self.path or self.origin}: among its {what}, {problem}: "
                                      "the file is damaged; restore it or download it again")

    @property
    def train_config(self) -> dict[str, Any] | None:
        """The recipe of the run that wrote a training checkpoint (else None)."""
        return self.extra.get("train_config")

    @property
    def pos_interpolation(self) -> str | None:
        """The position-embedding resampling a vitkit folder records (that of the weights it
        was converted from); None: the default for the record's origin."""
        return self.extra.get("pos_interpolation")

    @property
    def trained_in(self) -> str | None:
        """The working folder a training checkpoint's run trained in (older files, other
        formats: None), from which its recipe's relative data folder was read."""
        folder = self.extra.get("trained_in")
        return folder if isinstance(folder, str) else None

    @property
    def eval_tta(self) -> str:
        """The test-time augmentation the weights were evaluated with when trained (a run's
        recipe `tta`, or a vitkit folder's `eval_tta`); "none" when not recorded."""
        recipe = self.train_config
        recorded = recipe.get("tta") if isinstance(recipe, dict) else None
        return check_tta(str(recorded or self.extra.get("eval_tta") or "none"))


def check_tensors(state_dict: Any, source: object, shown: int = 5) -> None:
    """Refuse a state dict that is not a dict of floating-point tensors, or whose weights hold
    NaN or inf (naming the first few tensors and how many there are in all).

    Every reader's record passes through here, so the check is made once for all formats.
    """
    if not isinstance(state_dict, dict) or not state_dict:
        raise CheckpointError(f"{source} holds no state dict of tensors: it is damaged or not "
                              "a checkpoint; download or copy it again")
    wrong = [f"{name} ({_kind(value)})" for name, value in state_dict.items()
             if not isinstance(name, str) or not isinstance(value, torch.Tensor)
             or not (value.is_floating_point() or _is_step_counter(name, value))]
    if wrong:
        raise CheckpointError(
            f"{source}: {len(wrong)} entr{'y is' if len(wrong) == 1 else 'ies are'} not "
            f"floating-point weight tensors: {', '.join(wrong[:shown])}"
            f"{' ...' if len(wrong) > shown else ''}. Re-save the weights as float32 tensors.")
    bad = [name for name, value in state_dict.items() if not bool(torch.isfinite(value).all())]
    if bad:
        raise CheckpointError(
            f"{source}: {len(bad)} tensor{'s hold' if len(bad) > 1 else ' holds'} NaN or inf: "
            f"{', '.join(bad[:shown])}{' ...' if len(bad) > shown else ''}. Such weights give "
            "NaN outputs: the file is damaged or was saved from a diverged run; use another "
            "checkpoint (e.g. an earlier one of the run) or download it again.")


def _is_step_counter(name: str, value: torch.Tensor) -> bool:
    """BatchNorm's integer step counter (the hybrid stems' convolutions have BatchNorm)."""
    return name.endswith(".num_batches_tracked") and value.dtype == torch.int64 \
        and value.dim() == 0


def check_config_fits(config: ViTConfig, state_dict: dict[str, torch.Tensor],
                      source: object) -> None:
    """Refuse a config far larger than the weights it came with: a damaged config.json would
    otherwise build (or try to build) a model of billions of parameters before any shape is
    compared. Call it before anything is sized by the config."""
    held = sum(t.numel() for t in state_dict.values() if isinstance(t, torch.Tensor))
    width, patch = config.width, config.patch_size
    described = config.depth * (4 * width ** 2 + 2 * width * config.mlp_dim) \
        + (config.num_patches + 1) * width + config.in_chans * patch ** 2 * width
    if described > 2 * held + 1_000_000:
        raise CheckpointError(
            f"{source} holds {held:,} values, but its config describes a ViT of at least "
            f"{described:,} (depth {config.depth}, width {width}, mlp_dim {config.mlp_dim}, "
            f"channels {config.in_chans}, image {config.img_size}): the config does not belong "
            "to these weights; restore it or download the model again")


def _kind(value: object) -> str:
    return str(value.dtype) if isinstance(value, torch.Tensor) else type(value).__name__

