"""`explain`: every analysis of the paper's Figures 6 and 7 for one model and a set of images,
written as PNGs plus explain.json."""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from PIL import Image

from vitkit.analysis import figures
from vitkit.analysis.attention import (
    attention_rollout,
    attention_weights,
    check_rollout_options,
    map_source,
    output_token_map,
    rollout_conventions,
)
from vitkit.analysis.distance import (
    DISTANCE_CONVENTION,
    PAPER_IMAGES,
    mean_attention_distance,
    uniform_attention_distance,
)
from vitkit.analysis.filters import (
    PAPER_COMPONENTS,
    SIGN_CONVENTION,
    filter_components,
    pixel_filters,
    to_display,
)
from vitkit.analysis.inputs import as_batch
from vitkit.analysis.position_similarity import position_similarity, similarity_by_distance
from vitkit.errors import ConfigError, InputError
from vitkit.preprocess import preprocess_for
from vitkit.report import Report
from vitkit.tasks import Task, make_task, task_of

log = logging.getLogger(__name__)

JSON_FILE = "explain.json"
FILES = {"rollout": "attention_rollout.png", "heads": "attention_heads.png",
         "distance": "mean_attention_distance.png", "positions": "position_similarity.png",
         "filters": "embedding_filters.png"}


def _rounded(values: torch.Tensor, digits: int = 4) -> Any:
    return [_rounded(v, digits) for v in values] if values.dim() else round(values.item(), digits)


def explain(model: torch.nn.Module, images: torch.Tensor | Sequence[Image.Image],
            out_dir: str | Path, head_fusion: str = "mean", discard_ratio: float = 0.0,
            names: Sequence[str] = (), batch_size: int = 16, title: str = "",
            show: int = 8, image_source: str = "") -> dict[str, Any]:
    """Attention rollout, raw attention maps, mean attention distance, position-embedding
    similarity and filter components for `images` (uint8 (B, C, H, W) pictures, float
    (B, C, H, W) arrays in their data's units, or PIL images, run through
    `model.preprocess`). Rollout is output-agnostic: the same maps whatever the task; what
    the model predicts for each image is said in the task's words (`task_of(model)`: the
    class, the regression values or the multi-label labels) in the titles and in the JSON's
    "predictions" (`Task.describe`). Writes the PNGs named in FILES and explain.json to
    `out_dir`; returns the JSON's content. Every image counts in the distances (the paper
    used PAPER_IMAGES = 128) and rollout peaks; the rollout figure and the JSON's maps hold
    the first `show`. Maps with nothing to draw (all zero, constant) are logged as warnings
    and listed in the JSON's "warnings"; "conventions" states how each number is computed.
    """
    from vitkit.inference.merging import MergingVisionTransformer

    if isinstance(model, MergingVisionTransformer):
        raise ConfigError("explain needs every patch token (rollout and distances are maps "
                          "over the token grid), which token merging merges away: call "
                          "apply_token_merging(model, 0) first")
    check_rollout_options(head_fusion, discard_ratio)
    if show < 1:
        raise InputError(f"show={show}: the rollout figure needs at least 1 image")
    config = model.config
    out = Path(out_dir)
    preprocess = preprocess_for(model)
    batch = as_batch(images, preprocess)
    names = list(names) or [f"image {i}" for i in range(len(batch))]
    if len(names) != len(batch):
        raise InputError(f"{len(names)} names for {len(batch)} images: give one name per image")
    out.mkdir(parents=True, exist_ok=True)
    _remove_stale_figures(out)  # once the inputs are known good
    prefix, grid, source = config.num_prefix_tokens, config.grid_size, map_source(config)
    parameter = next(model.parameters())

    distance_sum, maps, logits, first = 0.0, [], [], None
    for start in range(0, len(batch), batch_size):
        chunk = batch[start:start + batch_size]
        out_logits, attentions = attention_weights(
            model, preprocess.normalize(chunk).to(parameter.device, parameter.dtype))
        attentions = [a.float().cpu() for a in attentions]
        distance_sum = distance_sum + len(chunk) * mean_attention_distance(
            attentions, grid, config.patch_size, prefix)
        rollout = attention_rollout(attentions, head_fusion, discard_ratio, prefix)
        maps.append(output_token_map(rollout, prefix, grid, source))
        logits.append(out_logits.float().cpu())
        if first is None:
            first = [a[0] for a in attentions]  # (heads, T, T) per layer, first image
    distances = distance_sum / len(batch)
    maps = torch.cat(maps)
    head_maps = torch.stack([output_token_map(a, prefix, grid, source) for a in first])
    uniform = uniform_attention_distance(grid, config.patch_size)
    label = title or config.name or "model"
    source_words = source.replace("_", " ")

    files = dict(FILES)  # names inside out_dir
    task, outputs = task_of(model), torch.cat(logits)
    titles = [_describe(name, row, model.class_names, config.num_classes, task)
              for name, row in zip(names, outputs, strict=True)]
    warnings = _flat_map_warnings(maps, head_maps, names, source_words, head_fusion,
                                  discard_ratio)
    for warning in warnings:
        log.warning("warning: %s", warning)
    figures.plot_rollout(batch[:show], maps[:show], out / files["rollout"], titles,
                         f"{label}: attention rollout from the {source_words}\n"
                         f"head fusion {head_fusion}, discard ratio {discard_ratio:g}")
    figures.plot_head_maps(batch[0], head_maps, out / files["heads"],
                           f"{label}: attention of the {source_words}, per layer and head\n"
                           f"raw weights (not rolled out) for {titles[0]}")
    figures.plot_mean_distance(distances, out / files["distance"], uniform,
                               f"{label}: mean attention distance", images=len(batch))

    try:
        similarity = position_similarity(model)
        figures.plot_position_similarity(similarity, out / files["positions"],
                                         f"{label}: position embedding similarity")
        positions = {"kind": config.pos_embed, "similarity_by_grid_distance":
                     similarity_by_distance(similarity)}
    except ConfigError as exc:
        files.pop("positions")
        positions = {"kind": config.pos_embed, "skipped": str(exc)}

    weights, filter_source = pixel_filters(model)
    pca = filter_components(weights, PAPER_COMPONENTS, filter_source)
    figures.plot_filter_components(to_display(pca.components), out / files["filters"],
                                   pca.explained_variance_ratio.tolist(),
                                   f"{label}: filter principal components (% of variance)\n"
                                   "sign: largest entry positive; each scaled to its range")

    report = {
        "model": {"name": config.name, "origin": model.origin,
                  "img_size": list(config.img_size), "patch_size": config.patch_size,
                  "grid": list(grid), "depth": config.depth, "heads": config.num_heads,
                  "class_token": config.class_token, "pool": config.pool,
                  "pos_embed": config.pos_embed, "stem": config.stem},
        "images": titles,
        "task": task.kind,
        "predictions": task.describe(outputs) if config.num_classes else [],
        "images_source": image_source or f"{len(batch)} image(s) passed in",
        "conventions": {**rollout_conventions(head_fusion, discard_ratio, prefix),
                        "mean_attention_distance": DISTANCE_CONVENTION,
                        "filter_sign": SIGN_CONVENTION, "figures": figures.MAP_SCALING},
        "warnings": warnings,
        "rollout": {"head_fusion": head_fusion, "discard_ratio": discard_ratio,
                    "map_source": source, "maps": _rounded(maps[:show], 5),
                    "images_shown": min(show, len(batch)), "peak_patch": _peaks(maps)},
        "mean_attention_distance_px": {
            "per_layer": _rounded(distances.mean(dim=1), 2),
            "per_head": _rounded(distances, 2), "images": len(batch),
            "paper_images": PAPER_IMAGES, "uniform_attention": round(uniform, 2)},
        "position_embedding": positions,
        "filters": {"source": pca.source, "components": len(pca.components),
                    "explained_variance_ratio": _rounded(pca.explained_variance_ratio)},
        "files": files,
    }
    (out / JSON_FILE).write_text(json.dumps(report, indent=1) + "\n")
    return report


def _remove_stale_figures(out: Path) -> None:
    """Delete the figures of an earlier explain in `out` (this run writes its own; one it
    skips, such as the position figure of a model without learned positions, would
    otherwise stay beside this run's explain.json as if it were this model's)."""
    stale = [out / name for name in (*FILES.values(), JSON_FILE) if (out / name).is_file()]
    for path in stale:
        path.unlink()
    if stale:
        log.info("replaced the earlier explain output in %s (%d files)", out, len(stale))


def _flat_map_warnings(maps: torch.Tensor, head_maps: torch.Tensor, names: Sequence[str],
                       source_words: str, head_fusion: str, discard_ratio: float) -> list[str]:
    """One line per kind of flat map (all zero, constant) among the rollout maps (one per
    image) and the first image's per-head maps: such panels have nothing to draw."""
    if head_fusion != "mean" or discard_ratio > 0:
        advice = "; mean head fusion with discard ratio 0 keeps every path"
    else:
        advice = ""
    warnings = []
    for kind in ("all zero", "constant"):
        flat = [name for name, heat in zip(names, maps, strict=True)
                if figures.flat_kind(heat) == kind]
        if flat:
            listed = "; ".join(flat[:3]) + (f" and {len(flat) - 3} more" if len(flat) > 3 else "")
            what = ("takes nothing from any patch" if kind == "all zero" else
                    "weighs every patch the same")
            warnings.append(f"the rollout map of {len(flat)} image(s) is {kind} ({listed}): "
                            f"the {source_words} {what} at head fusion {head_fusion}, "
                            f"discard ratio {discard_ratio:g}{advice}")
        heads = [f"layer {layer + 1} head {head + 1}"
                 for layer, row in enumerate(head_maps) for head, heat in enumerate(row)
                 if figures.flat_kind(heat) == kind]
        if heads:
            warnings.append(f"the raw attention of the {source_words} to the patches is {kind} "
                            f"at {', '.join(heads)} ({names[0]}): those panels of "
                            f"{FILES['heads']} show no contrast")
    return warnings


def _peaks(maps: torch.Tensor) -> list[list[int]]:
    """(row, column) of each map's strongest patch."""
    width = maps.shape[-1]
    flat = maps.reshape(len(maps), -1).argmax(dim=1)
    return [[int(i) // width, int(i) % width] for i in flat]


def _describe(name: str, logits: torch.Tensor, class_names: Sequence[str] | None,
              num_classes: int, task: Task | None = None) -> str:
    """"name -> predicted class (probability)", "name -> temperature=3.21" (regression),
    "name -> cat (91%), dog (60%)" (multi-label), as the task says it (`Task.title_words`);
    the name alone without an output."""
    words = make_task(task).title_words(logits, class_names, num_classes)
    return f"{name} -> {words}" if words else name


def explain_weights(source: str | Path, image_paths: Sequence[str | Path], out_dir: str | Path,
                    data: str | None = None, data_dir: str | None = None,
                    num_images: int | None = None, weights_dir: str | Path | None = None,
                    seed: int = 0, **options: Any) -> dict[str, Any]:
    """`explain` for a checkpoint (any format `load_pretrained` reads) on image files, or
    without files on `num_images` test images of `data` (default: the data a vitkit training
    checkpoint records), sampled across classes with `seed`. `num_images` defaults to the
    paper's 128 (PAPER_IMAGES); all the test images when there are fewer."""
    from vitkit.analysis.inputs import images_from_data, images_from_files
    from vitkit.catalog import read_weights
    from vitkit.predict import expand_inputs
    from vitkit.weights import build_model
    from vitkit.weights.formats.train_checkpoint import data_dir_from_here

    check_rollout_options(options.get("head_fusion", "mean"), options.get("discard_ratio", 0.0))
    files = expand_inputs(image_paths) if image_paths else []  # bad paths fail before loading
    weights = read_weights(source, weights_dir)
    model = build_model(weights)
    preprocess = preprocess_for(model)
    if files:
        images, names = images_from_files(files, preprocess)
        origin = f"{len(files)} image file(s)"
    else:
        num_images = PAPER_IMAGES if num_images is None else num_images
        task = task_of(model)
        recipe = weights.train_config
        if data_dir is None and data in (None, (recipe or {}).get("data")):  # the run's data
            recipe = data_dir_from_here(recipe, weights.path, trained_in=weights.trained_in)
        images, names = images_from_data(data, data_dir, num_images, preprocess, recipe,
                                         seed, task)
        origin = (f"{len(images)} test images sampled {task.sampled_words} (seed {seed}; "
                  f"{num_images} asked)")
    path = Path(source)
    options.setdefault("title", f"{path.resolve().parent.name}/{path.name}" if path.exists()
                       else str(source))
    return explain(model, images, out_dir, names=names, image_source=origin, **options)


def explain_report(source: str | Path, image_paths: Sequence[str | Path], out_dir: str | Path,
                   data: str | None = None, data_dir: str | None = None,
                   num_images: int | None = None, weights_dir: str | Path | None = None,
                   seed: int = 0, **options: Any) -> Report:
    """`vitkit explain`: `explain_weights`, with a two-line summary; the data is
    explain.json's."""
    report = explain_weights(source, image_paths, out_dir, data, data_dir, num_images,
                             weights_dir, seed, **options)
    distance = report["mean_attention_distance_px"]
    layers = ", ".join(f"{d:.1f}" for d in distance["per_layer"])
    text = (f"{len(report['images'])} image(s), {report['rollout']['images_shown']} drawn; "
            f"rollout from the {report['rollout']['map_source'].replace('_', ' ')}; mean "
            f"attention distance per layer over {distance['images']} image(s) (px): {layers}\n"
            f"wrote {len(report['files'])} figures and explain.json to {out_dir}")
    return Report(text, report)
