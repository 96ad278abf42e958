"""Position embeddings: fixed sin-cos tables (1-D and 2-D) and resampling to a new grid."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def sincos_1d(num_positions: int, width: int, temperature: float = 10000.0) -> torch.Tensor:
    """Transformer sinusoids: row p holds sin/cos of p / temperature^(2i/width), interleaved.

    Tensor ops only, so an ONNX trace follows a dynamic length (a dynamic-size model)."""
    position = torch.arange(num_positions, dtype=torch.float64)[:, None]
    inv_freq = temperature ** (-torch.arange(0, width, 2, dtype=torch.float64) / width)
    angles = position * inv_freq[None]
    return torch.stack([angles.sin(), angles.cos()], dim=-1).flatten(1).float()


def sincos_2d(grid_hw: tuple[int, int], width: int, temperature: float = 10000.0) -> torch.Tensor:
    """2-D sin-cos table as in big_vision: [sin(x), cos(x), sin(y), cos(y)], width/4 each.

    Rows follow the patches in raster order (row-major over the grid). Written with
    tensor ops only, so an ONNX trace follows a dynamic grid (a dynamic-size model).
    """
    grid_h, grid_w = grid_hw
    y = torch.arange(grid_h, dtype=torch.float64)[:, None].expand(grid_h, grid_w).flatten()
    x = torch.arange(grid_w, dtype=torch.float64)[None, :].expand(grid_h, grid_w).flatten()
    quarter = width // 4
    omega = torch.arange(quarter, dtype=torch.float64) / max(quarter - 1, 1)
    omega = 1.0 / temperature**omega
    x_angles = x[:, None] * omega[None]
    y_angles = y[:, None] * omega[None]
    table = torch.cat([x_angles.sin(), x_angles.cos(), y_angles.sin(), y_angles.cos()], dim=1)
    return table.float()


def fixed_positions(kind: str, grid_hw: tuple[int, int], num_prefix_tokens: int,
                    width: int) -> torch.Tensor:
    """The (1, prefix + grid_h*grid_w, width) table of a fixed kind: "sincos1d" numbers every
    token (prefix tokens first); "sincos2d" gives prefix tokens zero rows (no position)."""
    grid_h, grid_w = grid_hw
    if kind == "sincos1d":
        return sincos_1d(num_prefix_tokens + grid_h * grid_w, width)[None]
    if kind == "sincos2d":
        table = sincos_2d(grid_hw, width)
        return torch.cat([table.new_zeros(num_prefix_tokens, width), table])[None]
    raise ValueError(f"{kind!r} is not a fixed position embedding: use 'sincos1d' or 'sincos2d'")


def resample_grid_embed(pos_embed: torch.Tensor, old_grid: tuple[int, int],
                        new_grid: tuple[int, int], num_prefix_tokens: int = 1,
                        mode: str = "bilinear", antialias: bool = False,
                        align_corners: bool = False) -> torch.Tensor:
    """Resize (1, prefix + old_h*old_w, D) position embeddings to a new patch grid.

    The prefix (class token) rows are kept as they are; the grid, square or not, is
    interpolated in 2-D with `mode` ("bilinear" or "bicubic"). The defaults sample pixel
    centres (align_corners=False) without antialiasing: with bilinear, timm's reader of the
    official .npz files. `align_corners=True` with bilinear is the official code (vit_jax
    and big_vision: scipy.ndimage.zoom, order 1); bicubic with `antialias=True` is timm's
    `resample_abs_pos_embed` default. `vitkit.weights.resampling` names these conventions.
    `new_grid` may hold sizes traced as tensors (a dynamic-size model under
    `torch.jit.trace`): the resampling then stays in the graph.
    """
    if mode not in ("bilinear", "bicubic"):
        raise ValueError(f"mode={mode!r}: use 'bilinear' or 'bicubic'")
    old_grid, new_grid = tuple(old_grid), tuple(new_grid)
    expected = num_prefix_tokens + old_grid[0] * old_grid[1]
    if pos_embed.shape[1] != expected:
        raise ValueError(f"{pos_embed.shape[1]} position embeddings do not fit a "
                         f"{old_grid[0]}x{old_grid[1]} grid with {num_prefix_tokens} prefix "
                         f"token(s) ({expected})")
    if not torch.jit.is_tracing() and old_grid == new_grid:
        return pos_embed
    prefix, grid = pos_embed[:, :num_prefix_tokens], pos_embed[:, num_prefix_tokens:]
    width = pos_embed.shape[-1]
    grid = grid.reshape(1, old_grid[0], old_grid[1], width).permute(0, 3, 1, 2).float()
    grid = F.interpolate(grid, size=new_grid, mode=mode, align_corners=align_corners,
                         antialias=antialias)
    grid = grid.flatten(2).transpose(1, 2)  # (1, new_h * new_w, D), rows in raster order
    return torch.cat([prefix, grid.to(pos_embed.dtype)], dim=1)
