"""Principal components of the first layer's pixel filters (the paper's Figure 7, left)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitkit.errors import ConfigError
from vitkit.model.layers import ConvStem, PatchEmbed
from vitkit.model.resnet import HybridEmbed

PAPER_COMPONENTS = 28


@dataclass
class FilterComponents:
    """`components` (K, C, kh, kw), unit norm, strongest first; `explained_variance_ratio`
    (K,); `source` names the layer the filters came from."""

    components: torch.Tensor
    explained_variance_ratio: torch.Tensor
    source: str


def pixel_filters(model: nn.Module) -> tuple[torch.Tensor, str]:
    """The filters that touch the pixels, (D, C, kh, kw), and a description of their layer.

    Plain ViT: the P x P x C patch projection E. Conv stem: its first 3x3 convolution.
    ResNet hybrid: the 7x7 root convolution, weight-standardised as it is applied.
    """
    embed = model.patch_embed
    if isinstance(embed, PatchEmbed):
        weight, name = embed.proj.weight, "patch_embed.proj (patch embedding E)"
    elif isinstance(embed, ConvStem):
        weight, name = embed.convs[0].weight, "patch_embed.convs.0 (first 3x3 conv of the stem)"
    elif isinstance(embed, HybridEmbed):
        weight = embed.backbone.stem.conv.standardized_weight()
        name = "patch_embed.backbone.stem.conv (ResNet 7x7 root conv, weight-standardised)"
    else:
        raise ConfigError(f"no pixel filters known for a {type(embed).__name__} patch embedding")
    weight = weight.detach().cpu().float()
    size = "x".join(str(s) for s in weight.shape[2:])
    return weight, f"{name}: {weight.shape[0]} filters of {size}x{weight.shape[1]}"


def filter_components(filters: torch.Tensor, count: int = PAPER_COMPONENTS,
                      source: str = "") -> FilterComponents:
    """PCA over the filters (each a point): centre, SVD, the first min(count, rank) axes."""
    flat = filters.reshape(filters.shape[0], -1).double()
    flat = flat - flat.mean(dim=0, keepdim=True)
    _, singular, axes = torch.linalg.svd(flat, full_matrices=False)
    variance = singular**2
    total = variance.sum().clamp(min=1e-30)
    rank = int((singular > singular[0] * 1e-5).sum()) if singular.numel() else 0
    keep = min(count, rank)
    components = axes[:keep].reshape(keep, *filters.shape[1:]).float()
    return FilterComponents(components, (variance[:keep] / total).float(), source)


def to_display(components: torch.Tensor) -> torch.Tensor:
    """Scale each component to [0, 1] over all its channels (colours keep their balance)."""
    flat = components.reshape(components.shape[0], -1)
    low = flat.amin(dim=1).view(-1, 1, 1, 1)
    high = flat.amax(dim=1).view(-1, 1, 1, 1)
    return (components - low) / (high - low).clamp(min=1e-12)
