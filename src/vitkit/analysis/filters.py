"""Principal components of the first layer's pixel filters (the paper's Figure 7, left)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from vitkit.errors import ConfigError
from vitkit.model.stems import Stem

PAPER_COMPONENTS = 28
SIGN_CONVENTION = ("each component's largest-magnitude entry is positive (scikit-learn's PCA "
                   "convention since 1.5), so a run, a re-run and other libraries draw the "
                   "same colours")


@dataclass
class FilterComponents:
    """`components` (K, C, kh, kw), unit norm, strongest first; `explained_variance_ratio`
    (K,); `source` names the layer the filters came from."""

    components: torch.Tensor
    explained_variance_ratio: torch.Tensor
    source: str


def pixel_filters(model: nn.Module) -> tuple[torch.Tensor, str]:
    """The filters that touch the pixels, (D, C, kh, kw), and a description of their layer.

    The stem says which (`Stem.pixel_filters`): for a plain ViT the P x P x C patch
    projection E, for the conv stem its first 3x3 convolution, for the ResNet hybrid the 7x7
    root convolution, weight-standardised as it is applied.
    """
    stem = model.patch_embed
    if not isinstance(stem, Stem):
        raise ConfigError(f"no pixel filters known for a {type(stem).__name__} patch embedding: "
                          "use a stem from vitkit.model.stems")
    filters = stem.pixel_filters()
    weight = filters.weight.detach().cpu().float()
    size = "x".join(str(s) for s in weight.shape[2:])
    return weight, (f"patch_embed.{filters.layer} ({filters.what}): {weight.shape[0]} filters "
                    f"of {size}x{weight.shape[1]}")


def filter_components(filters: torch.Tensor, count: int = PAPER_COMPONENTS,
                      source: str = "") -> FilterComponents:
    """PCA over the filters (each a point): centre, SVD, the first min(count, rank) axes,
    signs fixed by `fix_signs` (an SVD may return any axis negated)."""
    flat = filters.reshape(filters.shape[0], -1).double()
    flat = flat - flat.mean(dim=0, keepdim=True)
    _, singular, axes = torch.linalg.svd(flat, full_matrices=False)
    variance = singular**2
    total = variance.sum().clamp(min=1e-30)
    rank = int((singular > singular[0] * 1e-5).sum()) if singular.numel() else 0
    keep = min(count, rank)
    components = fix_signs(axes[:keep]).reshape(keep, *filters.shape[1:]).float()
    return FilterComponents(components, (variance[:keep] / total).float(), source)


def fix_signs(components: torch.Tensor) -> torch.Tensor:
    """Flip each component (a row, or a (C, kh, kw) filter) so that its largest-magnitude
    entry is positive; the first such entry decides a tie. A component and its negation
    give the same result."""
    flat = components.reshape(components.shape[0], -1)
    strongest = flat.gather(1, flat.abs().argmax(dim=1, keepdim=True))
    signs = torch.where(strongest < 0, -1.0, 1.0).to(flat.dtype)
    return (flat * signs).reshape(components.shape)


def to_display(components: torch.Tensor) -> torch.Tensor:
    """Scale each component to [0, 1] over all its channels (colours keep their balance)."""
    flat = components.reshape(components.shape[0], -1)
    low = flat.amin(dim=1).view(-1, 1, 1, 1)
    high = flat.amax(dim=1).view(-1, 1, 1, 1)
    return (components - low) / (high - low).clamp(min=1e-12)
