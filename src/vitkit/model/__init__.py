"""The Vision Transformer and its layers."""

from vitkit.model.create import count_parameters, create_model, resolve_config
from vitkit.model.vit import VisionTransformer

__all__ = ["VisionTransformer", "count_parameters", "create_model", "resolve_config"]
