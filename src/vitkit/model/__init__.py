"""The Vision Transformer, its stems and its layers (by name: `vitkit.catalog.create_model`)."""

from vitkit.model.info import ModelInfo
from vitkit.model.stems import Stem, build_stem
from vitkit.model.vit import VisionTransformer

__all__ = ["ModelInfo", "Stem", "VisionTransformer", "build_stem"]
