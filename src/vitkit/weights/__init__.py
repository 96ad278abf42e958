"""Weights on disk: `read_local` (a local file or folder into a `WeightsRecord`),
`build_model` (a record into a model) and `save_pretrained`. Names ("B/16-i21k",
"hf-hub:ORG/NAME") are resolved by `vitkit.catalog`, whose `read_weights` and
`load_pretrained` fetch them and read them here.

Read, recognised by content (`vitkit.weights.formats`, one adapter per format): official
Google .npz (every layout), timm and Hugging Face state dicts (.safetensors, or .bin/.pth read
with `torch.load(weights_only=True)`) and model folders, vitkit's folder (model.safetensors +
config.json), vitkit training checkpoints (last.pt, best.pt) and training run folders. Every
reader returns a `WeightsRecord`.
"""

from __future__ import annotations

from pathlib import Path

import torch

from vitkit.errors import CheckpointError
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess, preprocess_for
from vitkit.weights import formats
from vitkit.weights.build import build_model
from vitkit.weights.formats.base import ReadOptions
from vitkit.weights.formats.hf import convert_hf
from vitkit.weights.formats.npz import convert_npz, read_npz, save_npz, to_official_arrays
from vitkit.weights.formats.timm import convert_timm
from vitkit.weights.loading import load_state_dict_checked
from vitkit.weights.record import ORIGINS, WeightsRecord
from vitkit.weights.resampling import POS_INTERPOLATIONS

Size = int | tuple[int, int]


def read_local(path: str | Path, source_img_size: Size | None = None, *,
               img_size: Size | None = None, num_heads: int | None = None,
               global_pool: str | None = None) -> WeightsRecord:
    """Read and convert the weights in a local file or folder without building a model.

    `source_img_size` is the training resolution of a file with a non-square position grid
    (`img_size`, the size the model will have, stands in for it when its grid has as many
    cells); `num_heads` and `global_pool` complete timm state dicts whose shapes leave them
    open. A run folder is read as its best.pt (else last.pt).
    """
    options = ReadOptions(source_img_size, img_size, num_heads, global_pool)
    return formats.read_record(path, options)


def save_pretrained(model: VisionTransformer, directory: str | Path,
                    preprocess: Preprocess | None = None,
                    class_names: list[str] | None = None) -> Path:
    """Write vitkit's format: model.safetensors + config.json (config, and the model's record
    `model.info`: preprocessing, classes, the task the weights were trained for, the
    test-time augmentation its training run evaluated with, and the position-embedding
    resampling of the weights it was loaded from: a folder converted from an .npz resizes as
    vit_jax does, one from a timm file as timm does)."""
    model = unwrapped(model)
    if any(param.is_meta for param in model.parameters()):
        raise CheckpointError("the model is on the meta device, so it holds no weights to "
                              "save: load some first (load_pretrained, or model.to_empty("
                              "device='cpu') and then initialise or load_state_dict)")
    info = model.info
    class_names = class_names if class_names is not None else info.class_names
    return formats.vitkit.write(model.state_dict(), model.config,
                                preprocess or preprocess_for(model), directory, class_names,
                                info.weights_kind, info.task, info.eval_tta,
                                info.pos_interpolation)


def unwrapped(model: torch.nn.Module) -> VisionTransformer:
    """The vitkit model inside `torch.compile`'s wrapper (`_orig_mod`) or DDP's and
    DataParallel's (`module`), whose state dicts prefix every key; refused when none is."""
    inner: torch.nn.Module | None = model
    while inner is not None and not isinstance(inner, VisionTransformer):
        inner = getattr(inner, "_orig_mod", None) or getattr(inner, "module", None)
    if inner is None:
        raise CheckpointError(f"save_pretrained takes a vitkit VisionTransformer (or one "
                              f"compiled or wrapped in DDP), not {type(model).__name__}")
    return inner


__all__ = ["ORIGINS", "POS_INTERPOLATIONS", "WeightsRecord", "build_model",
           "convert_hf", "convert_npz", "convert_timm", "load_state_dict_checked", "read_local",
           "read_npz", "save_npz", "save_pretrained", "to_official_arrays"]
