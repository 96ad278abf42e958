"""Position-embedding similarity (the paper's Figure 7, centre): one tile per patch position."""

from __future__ import annotations

import torch
from torch import nn

from vitkit.errors import ConfigError, InputError


def cosine_similarity_grid(embeddings: torch.Tensor, grid: tuple[int, int]) -> torch.Tensor:
    """(N, D) embeddings of a raster-ordered grid -> (gh, gw, gh, gw) cosine similarities.

    Entry [i, j] is the tile of patch (i, j): its similarity to every position.
    """
    grid_h, grid_w = grid
    if embeddings.dim() != 2 or embeddings.shape[0] != grid_h * grid_w:
        raise InputError(f"expected {grid_h * grid_w} position embeddings (N, D) for a "
                         f"{grid_h}x{grid_w} grid, got {tuple(embeddings.shape)}")
    unit = embeddings.double()
    unit = unit / unit.norm(dim=1, keepdim=True).clamp(min=1e-12)
    return (unit @ unit.T).reshape(grid_h, grid_w, grid_h, grid_w).float()


def position_similarity(model: nn.Module) -> torch.Tensor:
    """(gh, gw, gh, gw) similarity of the model's patch position embeddings (learned or fixed).

    The class token's row (when present) is left out: it has no position on the grid.
    """
    config = model.config
    table = getattr(model, "pos_embed", None)
    if table is None:
        raise ConfigError(f"the model has no position embeddings (pos_embed="
                          f"{config.pos_embed!r}), so there is no similarity to draw; use a "
                          "model built with pos_embed='learned', 'sincos1d' or 'sincos2d'")
    patches = table.detach()[0, config.num_prefix_tokens:]
    return cosine_similarity_grid(patches.cpu(), config.grid_size)


def similarity_by_distance(similarity: torch.Tensor) -> dict[str, float]:
    """Mean similarity at each Euclidean grid distance, in patches, for the JSON: one entry
    per distance that occurs, keyed by it to 6 significant digits ("1", "1.41421", "2",
    "2.23607", ...: distinct for grids of up to 200x200); pairs at exactly that distance,
    none pooled with a neighbour."""
    grid_h, grid_w = similarity.shape[:2]
    rows, cols = torch.meshgrid(torch.arange(grid_h), torch.arange(grid_w), indexing="ij")
    coords = torch.stack([rows.flatten(), cols.flatten()], dim=1)
    squared = ((coords[:, None] - coords[None]) ** 2).sum(dim=-1).flatten()  # exact integers
    values, which = torch.unique(squared, return_inverse=True)
    flat = similarity.reshape(-1).double()
    sums = torch.zeros(len(values), dtype=torch.float64).index_add_(0, which, flat)
    means = sums / torch.bincount(which, minlength=len(values))
    return {f"{value ** 0.5:.6g}": round(mean, 4)
            for value, mean in zip(values.tolist(), means.tolist(), strict=True)}
