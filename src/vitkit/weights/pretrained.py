"""Moved: the doors to disk are in `vitkit.weights`; this name stays for existing imports."""

from vitkit.weights import (
    LoadedWeights,
    WeightsRecord,
    build_model,
    load_pretrained,
    load_weights,
    read_weights,
    save_pretrained,
)

__all__ = ["LoadedWeights", "WeightsRecord", "build_model", "load_pretrained", "load_weights",
           "read_weights", "save_pretrained"]
