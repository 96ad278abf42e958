"""Mean attention distance (the paper's Figure 7, right): how far each head looks, in pixels.

The paper averages over 128 example images (Appendix D.7, Figure 11 caption);
`PAPER_IMAGES` is that count.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vitkit.errors import InputError

PAPER_IMAGES = 128
DISTANCE_CONVENTION = (
    "patch-to-patch attention only (the class token has no position): each query patch's row "
    "is renormalised to sum 1 over the patch keys, weighted by the distances between patch "
    "centres, then averaged over query patches and images (a query with no attention on "
    "patches at all is left out). probing-vits drops the class "
    "token's row and column without renormalising, which gives each query's distance times "
    "its share of attention on patches")


def patch_distances(grid: tuple[int, int], patch_size: int) -> torch.Tensor:
    """(N, N) Euclidean distances in pixels between patch centres, raster order."""
    rows, cols = torch.meshgrid(torch.arange(grid[0], dtype=torch.float64),
                                torch.arange(grid[1], dtype=torch.float64), indexing="ij")
    centres = torch.stack([rows.flatten(), cols.flatten()], dim=1) * patch_size
    return torch.cdist(centres, centres)


def mean_attention_distance(attentions: Sequence[torch.Tensor] | torch.Tensor,
                            grid: tuple[int, int], patch_size: int,
                            num_prefix_tokens: int = 0) -> torch.Tensor:
    """(layers, heads): attention-weighted query-key distance in input pixels.

    Only patch-to-patch attention counts (a class token has no position): each query
    patch's row is renormalised to sum 1 over the patch keys, weighted with the distances
    between patch centres (patch_size pixels apart; for a hybrid stem, its token stride),
    and averaged over query patches and images (`DISTANCE_CONVENTION`); however small a
    query's share of attention on patches, it is renormalised (a query with none at all,
    its weights underflowed to 0, is left out; a head with no such query reads 0). Without the
    renormalisation (probing-vits' formula) each query's distance would shrink by the share
    of its attention that went to the class token.
    """
    distances = patch_distances(grid, patch_size)
    num_patches = distances.shape[0]
    result = []
    for attention in attentions:
        if attention.dim() != 4 or attention.shape[-1] != num_prefix_tokens + num_patches:
            raise InputError(f"attention {tuple(attention.shape)} does not fit a {grid[0]}x"
                             f"{grid[1]} grid with {num_prefix_tokens} prefix token(s): expected "
                             f"(batch, heads, {num_prefix_tokens + num_patches}, "
                             f"{num_prefix_tokens + num_patches})")
        patches = attention[..., num_prefix_tokens:, num_prefix_tokens:].double()
        share = patches.sum(dim=-1)  # (B, heads, N): each query's attention on patches
        counted = share > 0  # a query with none there has no patch-to-patch distance
        weighted = (patches * distances.to(patches.device)).sum(dim=-1)
        per_query = torch.where(counted, weighted / share.where(counted, 1.0), 0.0)
        queries = counted.sum(dim=(0, 2))
        result.append(per_query.sum(dim=(0, 2)) / queries.clamp(min=1))
    return torch.stack(result).float()


def uniform_attention_distance(grid: tuple[int, int], patch_size: int) -> float:
    """The mean distance of a head attending uniformly to every patch (a reference line)."""
    return patch_distances(grid, patch_size).mean().item()
