"""Weights in foreign layouts (timm, Hugging Face) converted to vitkit's."""

from vitkit.weights.hf import convert_hf
from vitkit.weights.loading import load_state_dict_checked
from vitkit.weights.timm import convert_timm

__all__ = ["convert_hf", "convert_timm", "load_state_dict_checked"]
