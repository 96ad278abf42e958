"""matplotlib figures of the paper's analyses (Agg backend): attention maps, mean attention
distance, position-embedding similarity, principal components of the pixel filters.

Figures are saved at DPI pixels per inch with no cropping, so their pixel sizes follow
from their contents (see each function).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

DPI = 100
TILE = 1.6  # inches per image tile in the attention figures
HEAD_TILE = 1.2
FILTER_TILE = 0.9
FILTER_LABEL = 0.15  # inches above each filter tile for its label
FILTER_COLUMNS = 7
TITLE = 0.4  # inches of room for a figure title


def _image_hwc(image: torch.Tensor) -> np.ndarray:
    """uint8 (C, H, W) -> what imshow takes: (H, W, 3) or (H, W) for grey."""
    array = image.detach().cpu()
    if array.shape[0] == 3:
        return array.permute(1, 2, 0).numpy()
    return array.float().mean(dim=0).numpy()


def _upsample(heat: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """(gh, gw) map -> (H, W) scaled to [0, 1], bilinear."""
    heat = heat.detach().cpu().float()
    heat = (heat - heat.min()) / (heat.max() - heat.min()).clamp(min=1e-12)
    return F.interpolate(heat[None, None], size=size, mode="bilinear",
                         align_corners=False)[0, 0].clamp(0, 1).numpy()


def _show_image(ax: plt.Axes, image: torch.Tensor) -> None:
    array = _image_hwc(image)
    ax.imshow(array, cmap=None if array.ndim == 3 else "gray")
    ax.set_axis_off()


def _save(fig: plt.Figure, path: str | Path) -> Path:
    fig.savefig(path, dpi=DPI)
    plt.close(fig)
    return Path(path)


def plot_rollout(images: torch.Tensor, maps: torch.Tensor, path: str | Path,
                 titles: Sequence[str] = (), title: str = "") -> Path:
    """A row per image: the image, its rollout map, the map over the image.

    Size: 3 * 160 px wide, 160 px per image + 40 px high.
    """
    count = len(images)
    fig, axes = plt.subplots(count, 3, figsize=(3 * TILE, count * TILE + TITLE), squeeze=False)
    size = tuple(images.shape[-2:])
    for row in range(count):
        heat = _upsample(maps[row], size)
        _show_image(axes[row, 0], images[row])
        axes[row, 1].imshow(heat, cmap="jet", vmin=0, vmax=1)
        axes[row, 1].set_axis_off()
        _show_image(axes[row, 2], images[row])
        axes[row, 2].imshow(heat, cmap="jet", alpha=0.5, vmin=0, vmax=1)
        if row < len(titles):
            axes[row, 1].set_title(titles[row], fontsize=7)
    fig.suptitle(title or "attention rollout", fontsize=9)
    fig.tight_layout(pad=0.3, rect=(0, 0, 1, 1 - TITLE / (count * TILE + TITLE)))
    return _save(fig, path)


def plot_head_maps(image: torch.Tensor, maps: torch.Tensor, path: str | Path,
                   title: str = "") -> Path:
    """Raw attention per layer (rows) and head (columns) for one image, the image first.

    `maps` is (layers, heads, gh, gw). Size: (heads + 1) * 120 px by layers * 120 + 40 px.
    """
    layers, heads = maps.shape[:2]
    fig, axes = plt.subplots(layers, heads + 1, squeeze=False,
                             figsize=((heads + 1) * HEAD_TILE, layers * HEAD_TILE + TITLE))
    for layer in range(layers):
        _show_image(axes[layer, 0], image)
        axes[layer, 0].set_title(f"layer {layer + 1}", fontsize=7)
        for head in range(heads):
            ax = axes[layer, head + 1]
            ax.imshow(maps[layer, head].cpu().numpy(), cmap="viridis")
            ax.set_xticks([])
            ax.set_yticks([])
            if layer == 0:
                ax.set_title(f"head {head + 1}", fontsize=7)
    fig.suptitle(title or "attention per layer and head", fontsize=9)
    fig.tight_layout(pad=0.3, rect=(0, 0, 1, 1 - TITLE / (layers * HEAD_TILE + TITLE)))
    return _save(fig, path)


def plot_mean_distance(distances: torch.Tensor, path: str | Path, uniform: float | None = None,
                       title: str = "") -> Path:
    """Mean attention distance (px) against depth, a dot per head (the paper's Figure 7,
    right); a dashed line marks uniform attention. Size: 500 x 400 px."""
    layers, heads = distances.shape
    fig, ax = plt.subplots(figsize=(5, 4))
    colours = plt.get_cmap("tab10" if heads <= 10 else "tab20")
    for head in range(heads):
        ax.scatter(np.arange(1, layers + 1), distances[:, head].cpu().numpy(), s=18,
                   color=colours(head % colours.N), label=f"head {head + 1}")
    if uniform is not None:
        ax.axhline(uniform, color="grey", linestyle="--", linewidth=1,
                   label=f"uniform attention ({uniform:.1f} px)")
    top = max(float(distances.max()), uniform or 0.0)
    ax.set(xlabel="network depth (layer)", ylabel="mean attention distance (pixels)",
           ylim=(0, 1.1 * top if top > 0 else 1), xticks=range(1, layers + 1))
    ax.set_title(title or "mean attention distance", fontsize=10)
    ax.grid(alpha=0.3)
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right")
    fig.tight_layout()
    return _save(fig, path)


def _mosaic(tiles: np.ndarray, gap: int = 1) -> np.ndarray:
    """(rows, cols, h, w) tiles -> one image with NaN gaps between them."""
    rows, cols, height, width = tiles.shape
    out = np.full((rows * (height + gap) - gap, cols * (width + gap) - gap), np.nan)
    for i in range(rows):
        for j in range(cols):
            top, left = i * (height + gap), j * (width + gap)
            out[top:top + height, left:left + width] = tiles[i, j]
    return out


def plot_position_similarity(similarity: torch.Tensor, path: str | Path,
                             title: str = "") -> Path:
    """A gh x gw grid of tiles, tile (i, j) the cosine similarity of patch (i, j)'s position
    embedding to every position (the paper's Figure 7, centre). One colour scale for all
    tiles: -1..1 as in the paper, or from the lowest value when all are positive (fixed
    sin-cos tables stay above ~0.5). Size: 650 x 600 px."""
    grid_h, grid_w = similarity.shape[:2]
    mosaic = _mosaic(similarity.cpu().numpy())
    low = float(similarity.min())
    vmin = -1.0 if low < 0 else math.floor(10 * low) / 10
    fig, ax = plt.subplots(figsize=(6.5, 6))
    image = ax.imshow(mosaic, cmap="viridis", vmin=vmin, vmax=1)
    ax.set_xticks([j * (grid_w + 1) + (grid_w - 1) / 2 for j in range(grid_w)],
                  [str(j + 1) for j in range(grid_w)], fontsize=6)
    ax.set_yticks([i * (grid_h + 1) + (grid_h - 1) / 2 for i in range(grid_h)],
                  [str(i + 1) for i in range(grid_h)], fontsize=6)
    ax.set(xlabel="input patch column", ylabel="input patch row")
    ax.set_title(title or "position embedding similarity", fontsize=10)
    ax.tick_params(length=0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03, label="cosine similarity")
    fig.tight_layout()
    return _save(fig, path)


def plot_filter_components(components: torch.Tensor, path: str | Path,
                           explained: Sequence[float] = (), title: str = "") -> Path:
    """Components (K, C, kh, kw) scaled to [0, 1], RGB tiles (grey for other channel counts),
    7 per row as in the paper's Figure 7, left.
    Size: 7 * 90 px wide, ceil(K / 7) * 105 + 40 px high."""
    count = len(components)
    rows = max(1, math.ceil(count / FILTER_COLUMNS))
    cell_h = FILTER_TILE + FILTER_LABEL
    fig_w, fig_h = FILTER_COLUMNS * FILTER_TILE, rows * cell_h + TITLE
    fig = plt.figure(figsize=(fig_w, fig_h))
    side = 0.8 * FILTER_TILE  # tiles laid out by hand: square, a label above each
    for index in range(count):
        row, col = divmod(index, FILTER_COLUMNS)
        left = col * FILTER_TILE + (FILTER_TILE - side) / 2
        bottom = fig_h - TITLE - (row + 1) * cell_h + 0.05
        ax = fig.add_axes((left / fig_w, bottom / fig_h, side / fig_w, side / fig_h))
        ax.set_axis_off()
        tile = components[index].cpu()
        array = tile.permute(1, 2, 0).numpy() if tile.shape[0] == 3 else tile.mean(0).numpy()
        ax.imshow(array, cmap=None if array.ndim == 3 else "gray", vmin=0, vmax=1,
                  interpolation="nearest")
        label = f"{index + 1}" + (f": {100 * explained[index]:.1f}%" if index < len(explained)
                                  else "")
        ax.set_title(label, fontsize=6, pad=2)
    fig.suptitle(title or "principal components of the pixel filters", fontsize=9,
                 y=1 - 0.1 / fig_h, va="top")
    return _save(fig, path)
