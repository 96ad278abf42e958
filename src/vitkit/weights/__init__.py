"""Weights: official .npz, timm, Hugging Face and vitkit's own format; named checkpoints."""

from vitkit.weights.hf import convert_hf
from vitkit.weights.hub import named_checkpoints, resolve_named
from vitkit.weights.loading import load_state_dict_checked
from vitkit.weights.npz import convert_npz, read_npz, save_npz, to_official_arrays
from vitkit.weights.pretrained import (
    LoadedWeights,
    build_model,
    load_pretrained,
    load_weights,
    read_weights,
    save_pretrained,
)
from vitkit.weights.timm import convert_timm

__all__ = ["LoadedWeights", "build_model", "convert_hf", "convert_npz", "convert_timm",
           "load_pretrained", "load_state_dict_checked", "load_weights", "named_checkpoints",
           "read_npz", "read_weights", "resolve_named", "save_npz", "save_pretrained",
           "to_official_arrays"]
