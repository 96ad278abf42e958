"""vitkit's own format: a folder with model.safetensors (the state dict) and config.json
(format, version, model config, preprocessing, class names, which weights)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from vitkit.config import ViTConfig
from vitkit.data.preprocess import Preprocess, official_preprocess
from vitkit.errors import CheckpointError
from vitkit.weights.formats.base import ReadOptions
from vitkit.weights.formats.sniff import CONFIG_FILE, Found, load_safetensors
from vitkit.weights.record import WeightsRecord

FORMAT_NAME = "vitkit"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"


def _is_vitkit_config(meta: dict | None) -> bool:
    return bool(meta) and meta.get("format") == FORMAT_NAME


def detect(found: Found) -> bool:
    """The folder, or its model.safetensors (found through the config.json beside it)."""
    return found.kind in ("folder", "safetensors") and _is_vitkit_config(found.config())


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    folder = found.path if found.kind == "folder" else found.path.parent
    weights = folder / WEIGHTS_FILE
    if not weights.is_file():
        raise CheckpointError(f"{folder} has a vitkit {CONFIG_FILE} but no {WEIGHTS_FILE}: "
                              "copy the weights file beside it")
    meta = found.config() or {}
    config = ViTConfig.from_dict(meta["model"])
    preprocess = Preprocess.from_dict(meta["preprocess"]) if meta.get("preprocess") else \
        official_preprocess(config.img_size, config.in_chans)
    return WeightsRecord(config, load_safetensors(weights), preprocess, "vitkit",
                         meta.get("class_names"), weights=meta.get("weights", "raw"),
                         path=weights)


def write(state_dict: dict[str, torch.Tensor], config: ViTConfig, preprocess: Preprocess,
          directory: str | Path, class_names: list[str] | None = None,
          weights: str = "raw") -> Path:
    """Write the folder; returns it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    tensors = {k: v.detach().contiguous().cpu() for k, v in state_dict.items()}
    save_file(tensors, directory / WEIGHTS_FILE, metadata={"format": FORMAT_NAME})
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "model": config.to_dict(),
            "preprocess": preprocess.to_dict(), "class_names": class_names, "weights": weights}
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return directory
