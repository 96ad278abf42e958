"""Weights on disk: the only doors are `read_weights`, `load_pretrained`, `load_weights`,
`save_pretrained` (and `build_model`, from a record to a model).

Read, recognised by content (`vitkit.weights.formats`, one adapter per format): official
Google .npz (every layout), named official checkpoints ("B/16-i21k", the AugReg
"B/16-augreg-i21k-i1k-384"), Hub repositories ("hf-hub:ORG/NAME[@REVISION]", through
huggingface_hub's cache), timm and Hugging Face
state dicts (.safetensors, or .bin/.pth read with `torch.load(weights_only=True)`) and model
folders, vitkit's folder (model.safetensors + config.json), vitkit training checkpoints
(last.pt, best.pt) and training run folders. Every reader returns a `WeightsRecord`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitkit.errors import CheckpointError
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess, preprocess_for
from vitkit.weights import formats
from vitkit.weights.build import build_model
from vitkit.weights.formats.base import ReadOptions
from vitkit.weights.formats.hf import convert_hf
from vitkit.weights.formats.hub import named_checkpoints, resolve_named
from vitkit.weights.formats.npz import convert_npz, read_npz, save_npz, to_official_arrays
from vitkit.weights.formats.timm import convert_timm
from vitkit.weights.loading import load_state_dict_checked
from vitkit.weights.record import ORIGINS, WeightsRecord
from vitkit.weights.resampling import POS_INTERPOLATIONS

Size = int | tuple[int, int]


def read_weights(source: str | Path, weights_dir: str | Path | None = None,
                 download: bool | None = None, source_img_size: Size | None = None, *,
                 img_size: Size | None = None, num_heads: int | None = None,
                 global_pool: str | None = None) -> WeightsRecord:
    """Read and convert weights (a file, folder, run folder or name) without building a model.

    `source_img_size` is the training resolution of a file with a non-square position grid
    (`img_size`, the size the model will have, stands in for it when its grid has as many
    cells); `num_heads` and `global_pool` complete timm state dicts whose shapes leave them
    open. A run folder is read as its best.pt (else last.pt).
    """
    options = ReadOptions(source_img_size, img_size, num_heads, global_pool)
    return formats.read_record(source, weights_dir, download, options)


def load_pretrained(source: str | Path, *, weights_dir: str | Path | None = None,
                    download: bool | None = None, pos_interpolation: str | None = None,
                    source_img_size: Size | None = None, **overrides: Any) -> VisionTransformer:
    """A ViT with weights from a file, folder, run folder or checkpoint name, in eval mode.

    >>> model = load_pretrained("B/16-i21k", img_size=384, num_classes=10)

    The model carries `model.preprocess` (what its inputs must look like) and
    `model.class_names` (when the checkpoint names its classes). At another `img_size` the
    position embeddings are resampled with `pos_interpolation` (one of POS_INTERPOLATIONS;
    default: as the format's own code does, e.g. vit_jax's corner-aligned bilinear for
    official .npz, timm's antialiased bicubic for timm and Hugging Face files).
    `source_img_size` is the training resolution of a file with a non-square position grid;
    `num_heads` and `global_pool` complete timm state dicts of non-standard widths.
    """
    hints = {k: overrides.pop(k) for k in ("num_heads", "global_pool") if k in overrides}
    weights = read_weights(source, weights_dir, download, source_img_size,
                           img_size=overrides.get("img_size"), **hints)
    return build_model(weights, pos_interpolation, **overrides)


def load_weights(model: VisionTransformer, source: str | Path, **read_options: Any) -> None:
    """Load a checkpoint into an existing model, strictly, with errors that name the fix."""
    read_options.setdefault("img_size", model.config.img_size)
    weights = read_weights(source, **read_options)
    try:
        load_state_dict_checked(model, weights.state_dict)
    except CheckpointError as exc:
        raise CheckpointError(f"{source} does not fit this model: {exc}") from exc


def save_pretrained(model: VisionTransformer, directory: str | Path,
                    preprocess: Preprocess | None = None,
                    class_names: list[str] | None = None) -> Path:
    """Write vitkit's format: model.safetensors + config.json (config, preprocessing, classes)."""
    class_names = class_names if class_names is not None else model.class_names
    return formats.vitkit.write(model.state_dict(), model.config,
                                preprocess or preprocess_for(model), directory, class_names,
                                model.weights_kind)


__all__ = ["ORIGINS", "POS_INTERPOLATIONS", "WeightsRecord", "build_model",
           "convert_hf", "convert_npz", "convert_timm", "load_pretrained",
           "load_state_dict_checked", "load_weights", "named_checkpoints", "read_npz",
           "read_weights", "resolve_named", "save_npz", "save_pretrained", "to_official_arrays"]
