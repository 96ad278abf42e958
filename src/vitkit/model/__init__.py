"""The Vision Transformer, its stems and its layers."""

from vitkit.model.create import count_parameters, create_model, resolve_config
from vitkit.model.stems import Stem, build_stem
from vitkit.model.vit import VisionTransformer

__all__ = ["Stem", "VisionTransformer", "build_stem", "count_parameters", "create_model",
           "resolve_config"]
