"""Moved to `vitkit.weights.formats.timm`; this name stays for existing imports."""

from vitkit.weights.formats.timm import config_from_timm_model, convert_timm

__all__ = ["config_from_timm_model", "convert_timm"]
