"""`WeightsRecord`: weights read from disk, as every reader returns them.

A record is a model config, a vitkit state dict that fits it, the `Preprocess` its inputs
need, the class names when the file names them, where it came from (`origin`) and which
weights of a run these are (`weights`). `build_model` turns one into a model;
`vitkit.weights.formats` holds one adapter per file format that reads (and writes) them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitkit.config import ViTConfig
from vitkit.data.preprocess import Preprocess
from vitkit.errors import ConfigError

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
    extra: dict[str, Any] = field(default_factory=dict)  # "train_config" of training files
    weights: str = "raw"  # one of WEIGHT_KINDS
    path: Path | None = None  # the file the tensors were read from

    def __post_init__(self) -> None:
        if self.origin not in ORIGINS:
            raise ConfigError(f"origin={self.origin!r} is not one of {', '.join(ORIGINS)}")
        if self.weights not in WEIGHT_KINDS:
            raise ConfigError(f"weights={self.weights!r} is not one of "
                              f"{', '.join(WEIGHT_KINDS)}")

    @property
    def train_config(self) -> dict[str, Any] | None:
        """The recipe of the run that wrote a training checkpoint (else None)."""
        return self.extra.get("train_config")


# The name used before the record had one owner; the same class.
LoadedWeights = WeightsRecord
