"""matplotlib figures of the paper's analyses (Agg backend): attention maps, mean attention
distance, position-embedding similarity, principal components of the pixel filters.

Figures are laid out by hand in inches and saved at DPI pixels per inch with no cropping,
so their pixel sizes follow from their contents (see each function). Each plot function
writes a PNG to a path, or to a binary file object (an `io.BytesIO`: figures served from
memory). Attention maps are scaled per map (0 = the map's weakest patch, 1 = its strongest;
`MAP_SCALING`) and a colour bar says so; a map with no contrast (all zero, or constant) is
marked on its panel.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import torch
import torch.nn.functional as F

DPI = 100
TILE = 1.6  # inches per image tile in the rollout figure
HEAD_TILE = 1.2  # inches per tile in the per-head figure
ROW_LABEL = 0.2  # inches above each rollout row for its image's name
HEADER = 0.2  # inches for column headers
LAYER_LABEL = 0.3  # inches left of the per-head rows for "layer l"
COLOUR_BAR = 0.9  # inches right of the maps for the colour bar and its label
FILTER_TILE = 0.9
FILTER_LABEL = 0.15  # inches above each filter tile for its label
FILTER_COLUMNS = 7
TITLE = 0.5  # inches of room for a two-line figure title
EDGE = 0.05  # inches a title keeps clear of the figure's edges (`fit_inside`)
ELLIPSIS = "\u2026"  # what stands for the start of a path cut to its end
MAP_SCALING = ("attention maps are drawn scaled per map: 0 = the map's weakest patch, 1 = its "
               "strongest (bilinear upsampling in the rollout overlays); explain.json holds the "
               "unscaled values")


def flat_kind(heat: torch.Tensor) -> str | None:
    """"all zero" or "constant" for a map with no contrast to draw, else None."""
    if not bool((heat != 0).any()):
        return "all zero"
    if float(heat.max() - heat.min()) <= 1e-12 * float(heat.abs().max()):
        return "constant"
    return None


def unit_scaled(heat: torch.Tensor) -> torch.Tensor:
    """A map scaled to [0, 1] (its min to 0, its max to 1); a flat map becomes zeros."""
    heat = heat.detach().cpu().float()
    return (heat - heat.min()) / (heat.max() - heat.min()).clamp(min=1e-12)


FLOAT_IMAGE_CMAP = "viridis"  # float arrays (data=arrays): the channel mean, min-max scaled


def _image_hwc(image: torch.Tensor) -> np.ndarray:
    """uint8 (C, H, W) -> what imshow takes: (H, W, 3) or (H, W) for grey; a float array
    (a field, not a picture) -> its channel mean scaled to [0, 1] (min to 0, max to 1)."""
    array = image.detach().cpu()
    if array.is_floating_point():
        return unit_scaled(array.mean(dim=0)).numpy()
    if array.shape[0] == 3:
        return array.permute(1, 2, 0).numpy()
    return array.float().mean(dim=0).numpy()


def _upsample(heat: torch.Tensor, size: tuple[int, int]) -> np.ndarray:
    """(gh, gw) map -> (H, W) scaled to [0, 1], bilinear."""
    return F.interpolate(unit_scaled(heat)[None, None], size=size, mode="bilinear",
                         align_corners=False)[0, 0].clamp(0, 1).numpy()


def _show_image(ax: plt.Axes, image: torch.Tensor) -> None:
    array = _image_hwc(image)
    if image.is_floating_point():
        ax.imshow(array, cmap=FLOAT_IMAGE_CMAP, vmin=0, vmax=1)
    else:
        ax.imshow(array, cmap=None if array.ndim == 3 else "gray")
    ax.set_axis_off()


def _mark_flat(ax: plt.Axes, heat: torch.Tensor) -> None:
    """Write "all zero" / "constant" across a panel whose map has no contrast."""
    kind = flat_kind(heat)
    if kind:
        ax.text(0.5, 0.5, kind, transform=ax.transAxes, ha="center", va="center", fontsize=7,
                color="black", bbox={"facecolor": "white", "alpha": 0.8, "linewidth": 0})


def _axes(fig: plt.Figure, left: float, top: float, width: float, height: float) -> plt.Axes:
    """An axes placed in inches from the figure's top-left corner."""
    fig_w, fig_h = fig.get_size_inches()
    return fig.add_axes((left / fig_w, 1 - (top + height) / fig_h, width / fig_w,
                         height / fig_h))


def _colour_bar(fig: plt.Figure, image: matplotlib.image.AxesImage, left: float, top: float,
                height: float, label: str) -> None:
    """A narrow bar 0..1 labelled as a per-map scale, placed in inches."""
    bar = fig.colorbar(image, cax=_axes(fig, left, top, 0.12, height), ticks=(0, 1))
    bar.ax.set_yticklabels(["min", "max"], fontsize=6)
    bar.set_label(label, fontsize=6)


def _title(fig: plt.Figure, title: str) -> None:
    """The figure title (one or two lines) in the top TITLE inches, fitted to the width."""
    fit_inside(fig.text(0.5, 1 - 0.06 / fig.get_size_inches()[1], title, ha="center",
                        va="top", fontsize=8, linespacing=1.4))


def fit_inside(text: matplotlib.text.Text) -> matplotlib.text.Text:
    """Fit a title into its figure's width, so that no letter falls off an edge: a line too
    wide has its paths (words with "/") cut to their ends behind an ellipsis ("…/parent/
    name.png": a path's end says which file it is), then is wrapped at spaces; a word still
    too wide keeps its end. The room is what the text's anchor and alignment leave (a title
    centred over its axes has twice the distance to the nearer edge); call it again once a
    layout has moved the axes."""
    fig = text.figure
    renderer = fig.canvas.get_renderer()
    font = text.get_fontproperties()
    x = text.get_transform().transform(text.get_position())[0]
    edge, width = EDGE * fig.dpi, fig.bbox.width
    room = {"left": width - x, "right": x}.get(text.get_horizontalalignment(),
                                               2 * min(x, width - x)) - 2 * edge

    def fits(line: str) -> bool:
        return renderer.get_text_width_height_descent(line, font, ismath=False)[0] <= room

    lines = [fitted for line in text.get_text().split("\n")
             for fitted in _fitted_line(line, fits)]
    text.set_text("\n".join(lines))
    return text


def _fitted_line(line: str, fits: Callable[[str], bool]) -> list[str]:
    """`line` as the lines that `fits` takes (see `fit_inside`)."""
    words = line.split(" ")
    for index in sorted((i for i, word in enumerate(words) if "/" in word.strip("/")),
                        key=lambda i: -len(words[i])):  # the longest path first
        if fits(" ".join(words)):
            return [" ".join(words)]
        tails = _path_tails(words[index])
        words[index] = next((tail for tail in tails
                             if fits(" ".join([*words[:index], tail, *words[index + 1:]]))),
                            tails[-1])
    lines: list[str] = []
    for word in words:
        joined = f"{lines[-1]} {word}" if lines else word
        if lines and fits(joined):
            lines[-1] = joined
        else:
            lines.append(word if fits(word) else _end_that_fits(word, fits))
    return lines


def _path_tails(word: str) -> list[str]:
    """"a/b/c/d.png" -> ["…/b/c/d.png", "…/c/d.png", "…/d.png"]: the path's ends, longest
    first."""
    parts = word.split("/")
    return [ELLIPSIS + "/" + "/".join(parts[k:]) for k in range(1, len(parts))] or [word]


def _end_that_fits(word: str, fits: Callable[[str], bool]) -> str:
    """The longest end of `word` behind an ellipsis that `fits` takes."""
    keep = next((n for n in range(len(word) - 1, 0, -1) if fits(ELLIPSIS + word[-n:])), 1)
    return ELLIPSIS + word[-keep:]


def tight_layout(fig: plt.Figure) -> None:
    """`fig.tight_layout()`, then each title fitted again (`fit_inside`) where the layout
    moved its axes."""
    fig.tight_layout()
    for text in [*fig.texts, *(ax.title for ax in fig.axes if ax.get_title())]:  # suptitle too
        fit_inside(text)


Target = str | Path | IO[bytes]  # where a figure goes: a file path or a binary file object


def _save(fig: plt.Figure, path: Target) -> Path | IO[bytes]:
    """Write the figure as PNG and close it; the path as a Path, or the file object."""
    fig.savefig(path, dpi=DPI, format="png")
    plt.close(fig)
    return Path(path) if isinstance(path, str | Path) else path


def plot_rollout(images: torch.Tensor, maps: torch.Tensor, path: Target,
                 titles: Sequence[str] = (), title: str = "") -> Path | IO[bytes]:
    """A row per image: the image, its rollout map and the map over the image, under column
    headers; each row's name in a strip above it; a colour bar for the per-map scale.

    Size: 3 * 160 + 90 px wide, 70 + 180 px per image high.
    """
    count = len(images)
    fig_w = 3 * TILE + COLOUR_BAR
    fig = plt.figure(figsize=(fig_w, TITLE + HEADER + count * (ROW_LABEL + TILE)))
    _title(fig, title or "attention rollout")
    side, pad = 0.94 * TILE, 0.03 * TILE
    for col, header in enumerate(("image", "rollout map", "overlay")):
        fig.text((col + 0.5) * TILE / fig_w, 1 - (TITLE + HEADER / 2) / fig.get_figheight(),
                 header, ha="center", va="center", fontsize=7, weight="bold")
    size = tuple(images.shape[-2:])
    shown = None
    for row in range(count):
        top = TITLE + HEADER + row * (ROW_LABEL + TILE)
        if row < len(titles):
            fit_inside(fig.text(1.5 * TILE / fig_w,
                                1 - (top + ROW_LABEL / 2) / fig.get_figheight(), titles[row],
                                ha="center", va="center", fontsize=7))
        panels = [_axes(fig, col * TILE + pad, top + ROW_LABEL + pad, side, side)
                  for col in range(3)]
        heat = _upsample(maps[row], size)
        _show_image(panels[0], images[row])
        shown = panels[1].imshow(heat, cmap="jet", vmin=0, vmax=1)
        panels[1].set_axis_off()
        _mark_flat(panels[1], maps[row])
        _show_image(panels[2], images[row])
        panels[2].imshow(heat, cmap="jet", alpha=0.5, vmin=0, vmax=1)
    _colour_bar(fig, shown, 3 * TILE + 0.15, TITLE + HEADER + ROW_LABEL + 0.1, TILE - 0.2,
                "rollout, scaled per map")
    return _save(fig, path)


def plot_head_maps(image: torch.Tensor, maps: torch.Tensor, path: Target,
                   title: str = "") -> Path | IO[bytes]:
    """Raw attention per layer (rows, labelled on the left) and head (columns, headed), the
    image first in each row; each map scaled on its own, as the colour bar says.

    `maps` is (layers, heads, gh, gw). Size: 30 + (heads + 1) * 120 + 90 px wide,
    70 + layers * 120 px high.
    """
    layers, heads = maps.shape[:2]
    fig_w = LAYER_LABEL + (heads + 1) * HEAD_TILE + COLOUR_BAR
    fig = plt.figure(figsize=(fig_w, TITLE + HEADER + layers * HEAD_TILE))
    fig_h = fig.get_figheight()
    _title(fig, title or "attention per layer and head")
    side, pad = 0.92 * HEAD_TILE, 0.04 * HEAD_TILE
    for col, header in enumerate(["image"] + [f"head {h + 1}" for h in range(heads)]):
        fig.text((LAYER_LABEL + (col + 0.5) * HEAD_TILE) / fig_w, 1 - (TITLE + HEADER / 2) / fig_h,
                 header, ha="center", va="center", fontsize=7, weight="bold")
    shown = None
    for layer in range(layers):
        top = TITLE + HEADER + layer * HEAD_TILE
        fig.text(LAYER_LABEL / 2 / fig_w, 1 - (top + HEAD_TILE / 2) / fig_h, f"layer {layer + 1}",
                 ha="center", va="center", rotation=90, fontsize=7, weight="bold")
        _show_image(_axes(fig, LAYER_LABEL + pad, top + pad, side, side), image)
        for head in range(heads):
            ax = _axes(fig, LAYER_LABEL + (head + 1) * HEAD_TILE + pad, top + pad, side, side)
            shown = ax.imshow(unit_scaled(maps[layer, head]).numpy(), cmap="viridis", vmin=0,
                              vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            _mark_flat(ax, maps[layer, head])
    _colour_bar(fig, shown, LAYER_LABEL + (heads + 1) * HEAD_TILE + 0.15, TITLE + HEADER + 0.1,
                HEAD_TILE - 0.2, "attention, scaled per map")
    return _save(fig, path)


def plot_mean_distance(distances: torch.Tensor, path: Target, uniform: float | None = None,
                       title: str = "", images: int | None = None) -> Path | IO[bytes]:
    """Mean attention distance (px) against depth, a dot per head (the paper's Figure 7,
    right); a dashed line marks uniform attention; the number of images averaged over is
    in the title. Size: 500 x 400 px."""
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
    title = title or "mean attention distance"
    if images is not None:
        title += f"\naveraged over {images} image{'s' if images != 1 else ''}"
    fit_inside(ax.set_title(title, fontsize=9))
    ax.grid(alpha=0.3)
    if heads <= 16:
        ax.legend(fontsize=6, ncol=2, loc="lower right")
    tight_layout(fig)
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


def plot_position_similarity(similarity: torch.Tensor, path: Target,
                             title: str = "") -> Path | IO[bytes]:
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
    fit_inside(ax.set_title(title or "position embedding similarity", fontsize=10))
    ax.tick_params(length=0)
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.03, label="cosine similarity")
    tight_layout(fig)
    return _save(fig, path)


def plot_filter_components(components: torch.Tensor, path: Target,
                           explained: Sequence[float] = (), title: str = "") -> Path | IO[bytes]:
    """Components (K, C, kh, kw) scaled to [0, 1], RGB tiles (grey for other channel counts),
    7 per row as in the paper's Figure 7, left, each labelled with its explained variance.
    Size: 7 * 90 px wide, ceil(K / 7) * 105 + 50 px high."""
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
    _title(fig, title or "principal components of the pixel filters")
    return _save(fig, path)
