"""Moved to `vitkit.weights.formats.hf`; this name stays for existing imports."""

from vitkit.weights.formats.hf import config_from_hf, convert_hf

__all__ = ["config_from_hf", "convert_hf"]
