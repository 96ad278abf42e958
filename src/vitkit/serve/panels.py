"""The paper's Figure 7 panels for `vitkit serve`, as PNG bytes drawn in memory by the same
code `vitkit explain` uses: mean attention distance, position-embedding similarity and the
principal components of the pixel filters.

Each panel is computed once per service and kept on it (`figure_png` caches the bytes in a
dict attribute of the service). Attention distance needs images: the model's own test data
when the weights record it and it is on this machine (never downloaded), else a fixed,
seeded set of generated images; the panel's title says which.
"""

from __future__ import annotations

import io
import logging
import threading
from typing import Any

import torch
import torch.nn.functional as F

from vitkit.analysis import figures
from vitkit.analysis.attention import attention_weights
from vitkit.analysis.distance import mean_attention_distance, uniform_attention_distance
from vitkit.analysis.filters import (
    PAPER_COMPONENTS,
    filter_components,
    pixel_filters,
    to_display,
)
from vitkit.analysis.position_similarity import position_similarity
from vitkit.errors import ConfigError, VitkitError
from vitkit.preprocess import Preprocess, preprocess_for

log = logging.getLogger(__name__)

FIGURES = ("attention_distance", "position_similarity", "filters")
DISTANCE_IMAGES = 32  # images averaged over (the paper used 128; a page should load in seconds)
GENERATED_SEED = 0
BATCH = 16
CACHE = "_vitkit_figures"  # the service attribute holding {name: PNG bytes}
_lock = threading.Lock()  # pyplot is not thread-safe; one panel is drawn at a time


def figure_png(service: Any, name: str) -> bytes:
    """The panel `name` (one of FIGURES) of `service.model` as PNG bytes, drawn on the first
    call and cached on the service. An unknown name is a ValueError (the route's 404)."""
    if name not in FIGURES:
        raise ValueError(f"unknown figure {name!r}: use one of {', '.join(FIGURES)}")
    with _lock:
        cache = getattr(service, CACHE, None)
        if cache is None:
            cache = {}
            setattr(service, CACHE, cache)
        if name not in cache:
            cache[name] = _DRAW[name](service)
        return cache[name]


def _label(service: Any) -> str:
    return getattr(service, "name", "") or service.model.config.name or "model"


def _png(draw: Any, *args: Any, **kwargs: Any) -> bytes:
    buffer = io.BytesIO()
    draw(*args, buffer, **kwargs)
    return buffer.getvalue()


# -- attention distance ------------------------------------------------------------------

def generated_images(preprocess: Preprocess, count: int = DISTANCE_IMAGES,
                     seed: int = GENERATED_SEED) -> torch.Tensor:
    """`count` seeded smooth random images at the model's size: coarse noise (an 8th of the
    size) upsampled bilinearly plus a little fine noise, so there are shapes at several
    scales to attend to. uint8 pictures for picture models (scale 255); float arrays of about
    unit spread after normalisation for array models, in their data's units."""
    generator = torch.Generator().manual_seed(seed)
    height, width = preprocess.img_size
    channels = preprocess.channels
    coarse = torch.rand(count, channels, max(2, height // 8), max(2, width // 8),
                        generator=generator)
    fine = torch.rand(count, channels, height, width, generator=generator)
    field = F.interpolate(coarse, size=(height, width), mode="bilinear", align_corners=False)
    field = (0.8 * field + 0.2 * fine).clamp(0, 1)
    if preprocess.scale == 255.0:
        return (field * 255).round().to(torch.uint8)
    mean = torch.tensor(preprocess.mean).view(1, -1, 1, 1)
    std = torch.tensor(preprocess.std).view(1, -1, 1, 1)
    return preprocess.scale * (mean + std * (field - 0.5) / 0.29)


def distance_images(service: Any, count: int = DISTANCE_IMAGES) -> tuple[torch.Tensor, str]:
    """The images the attention distance is averaged over, and where they come from: `count`
    test images of the data the weights were trained on when it is local (explain's
    sampling; Hugging Face datasets are not fetched), else `generated_images`."""
    model = service.model
    preprocess = preprocess_for(model)
    trained = getattr(service, "train_config", None) or {}
    data = trained.get("data")
    if isinstance(data, str) and not data.startswith("hf:"):
        from vitkit.analysis.inputs import images_from_data
        from vitkit.tasks import task_of

        try:
            images, _ = images_from_data(None, None, count, preprocess, trained, GENERATED_SEED,
                                         task_of(model))
            return images, f"{len(images)} test images of {data} (seed {GENERATED_SEED})"
        except (VitkitError, OSError) as exc:
            log.info("attention distance: %s not readable here (%s); using generated images",
                     data, exc)
    images = generated_images(preprocess, count)
    return images, f"{len(images)} generated images (smooth noise, seed {GENERATED_SEED})"


def attention_distances(service: Any) -> tuple[torch.Tensor, str]:
    """(layers, heads) mean attention distance in pixels over `distance_images`, computed as
    `vitkit explain` does (`mean_attention_distance` per batch, weighted by batch size), and
    the images' description. Cached on the service with the PNGs."""
    with _lock:
        return _attention_distances(service)


def _attention_distances(service: Any) -> tuple[torch.Tensor, str]:
    cache = getattr(service, CACHE, None)
    if cache is None:
        cache = {}
        setattr(service, CACHE, cache)
    if "distances" not in cache:
        model = service.model
        config, preprocess = model.config, preprocess_for(model)
        images, source = distance_images(service)
        parameter = next(model.parameters())
        total = torch.zeros(())
        for start in range(0, len(images), BATCH):
            chunk = images[start:start + BATCH]
            _, attentions = attention_weights(
                model, preprocess.normalize(chunk).to(parameter.device, parameter.dtype))
            total = total + len(chunk) * mean_attention_distance(
                [a.float().cpu() for a in attentions], config.grid_size, config.patch_size,
                config.num_prefix_tokens)
        cache["distances"] = (total / len(images), source)
    return cache["distances"]


def _draw_distance(service: Any) -> bytes:
    distances, source = _attention_distances(service)
    config = service.model.config
    uniform = uniform_attention_distance(config.grid_size, config.patch_size)
    return _png(figures.plot_mean_distance, distances, uniform=uniform,
                title=f"{_label(service)}: mean attention distance\non {source}")


# -- position similarity and filters -----------------------------------------------------

def _draw_positions(service: Any) -> bytes:
    label = _label(service)
    try:
        similarity = position_similarity(service.model)
    except ConfigError as exc:  # pos_embed="none": explain skips the figure; say why instead
        return _message_png(f"{label}: position embedding similarity", str(exc))
    return _png(figures.plot_position_similarity, similarity,
                title=f"{label}: position embedding similarity "
                      f"({service.model.config.pos_embed})")


def _draw_filters(service: Any) -> bytes:
    weights, source = pixel_filters(service.model)
    pca = filter_components(weights, PAPER_COMPONENTS, source)
    return _png(figures.plot_filter_components, to_display(pca.components),
                explained=pca.explained_variance_ratio.tolist(),
                title=f"{_label(service)}: filter principal components (% of variance)\n"
                      f"{pca.source}")


def _message_png(title: str, message: str) -> bytes:
    """A small panel with a title and a wrapped message, for a figure the model has none of."""
    import textwrap

    import matplotlib.pyplot as plt

    fig = plt.figure(figsize=(5, 2))
    fig.text(0.5, 0.85, title, ha="center", va="top", fontsize=9, weight="bold")
    fig.text(0.5, 0.6, textwrap.fill(message, 70), ha="center", va="top", fontsize=7)
    buffer = io.BytesIO()
    fig.savefig(buffer, dpi=figures.DPI, format="png")
    plt.close(fig)
    return buffer.getvalue()


_DRAW = {"attention_distance": _draw_distance, "position_similarity": _draw_positions,
         "filters": _draw_filters}
