"""Create models by name ("B/16", "cifar10-tutorial") or config, with keyword overrides."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from vitkit.config import ViTConfig, variant_config
from vitkit.model.vit import VisionTransformer


def resolve_config(name_or_config: str | Path | ViTConfig | dict[str, Any],
                   **overrides: Any) -> ViTConfig:
    """A config from a variant name, a JSON config file, a dict or a config, plus overrides."""
    if isinstance(name_or_config, ViTConfig):
        return name_or_config.replace(**overrides) if overrides else name_or_config
    if isinstance(name_or_config, dict):
        return ViTConfig.from_dict({**name_or_config, **overrides})
    if str(name_or_config).endswith(".json") or Path(str(name_or_config)).is_file():
        config = ViTConfig.from_json(name_or_config)
        return config.replace(**overrides) if overrides else config
    return variant_config(str(name_or_config), **overrides)


def create_model(name_or_config: str | Path | ViTConfig | dict[str, Any] = "B/16",
                 device: str | torch.device | None = None, **overrides: Any) -> VisionTransformer:
    """Build a randomly initialised ViT.

    >>> model = create_model("B/16", num_classes=10, img_size=384)
    """
    config = resolve_config(name_or_config, **overrides)
    with torch.device(device or "cpu"):
        return VisionTransformer(config)


def count_parameters(name_or_config: str | ViTConfig, **overrides: Any) -> int:
    """Exact parameter count, computed on the meta device (nothing allocated)."""
    model = create_model(name_or_config, device="meta", **overrides)
    return sum(p.numel() for p in model.parameters())
