"""`build_model`: a model from a `WeightsRecord`, at the size and head size asked for."""

from __future__ import annotations

from typing import Any

import torch

from vitkit.errors import CheckpointError, VitkitError
from vitkit.model.vit import VisionTransformer
from vitkit.weights.loading import load_state_dict_checked
from vitkit.weights.record import WeightsRecord, check_config_fits
from vitkit.weights.resampling import resize_model, resolve

# Overrides that change the loaded model rather than its config fields.
_SHAPE_OVERRIDES = ("num_classes", "img_size")


def build_model(weights: WeightsRecord, pos_interpolation: str | None = None,
                **overrides: Any) -> VisionTransformer:
    """Build the model, load the weights strictly, then apply `img_size` / `num_classes`.

    A new `img_size` resamples learned position embeddings with `pos_interpolation` (see
    `vitkit.weights.resampling`; None/"auto": the convention of the weights' format, e.g.
    "official" = vit_jax's corner-aligned bilinear for official .npz files). A new
    `num_classes` resets the head to zeros and drops the pre-logits layer, as the paper's
    fine-tuning does. Other overrides (dropout, drop_path, ...) must not change shapes.
    """
    resampling = resolve(pos_interpolation, weights.origin)
    reshape = {k: overrides.pop(k) for k in _SHAPE_OVERRIDES if k in overrides}
    config = weights.config.replace(**overrides) if overrides else weights.config
    check_config_fits(config, weights.state_dict, _source(weights))
    try:
        with torch.device("meta"):
            model = VisionTransformer(config)
    except (ValueError, RuntimeError) as exc:
        if isinstance(exc, VitkitError):
            raise
        raise CheckpointError(
            f"{_source(weights)} describe a ViT that cannot be built "
            f"({config.name or 'custom'}: {exc}): the file is inconsistent or not a plain "
            "ViT") from None
    model.to_empty(device="cpu")
    if config.pos_embed in ("sincos1d", "sincos2d"):  # non-persistent buffers: rebuild
        model.pos_embed = torch.nn.Buffer(VisionTransformer._make_pos_embed(config),
                                          persistent=False)
    try:
        load_state_dict_checked(model, weights.state_dict)
    except CheckpointError as exc:
        raise CheckpointError(
            f"{_source(weights)} do not fit the ViT their shapes describe "
            f"({config.name or 'custom'}): the file is inconsistent or not a plain ViT.\n{exc}"
        ) from exc
    preprocess = weights.preprocess
    if reshape.get("img_size") is not None:
        resize_model(model, reshape["img_size"], resampling)
        preprocess = preprocess.replace(img_size=list(model.config.img_size))
    class_names, task, eval_tta = weights.class_names, weights.task, weights.eval_tta
    num_classes = reshape.get("num_classes")
    if num_classes is not None and num_classes != config.num_classes:
        model.reset_classifier(num_classes, zero_init=True)
        class_names, task, eval_tta = None, None, "none"  # a new head: not what was trained
    model.preprocess = preprocess
    model.class_names = class_names
    model.task = task  # vitkit.tasks.task_of(model) reads it (None: classification)
    model.origin = weights.origin
    model.weights_kind = weights.weights
    model.eval_tta = eval_tta
    return model.eval()


def _source(weights: WeightsRecord) -> str:
    where = f" of {weights.path}" if weights.path is not None else ""
    return f"the {weights.origin} weights{where}"
