"""`build_model`: a model from a `WeightsRecord`, at the size and head size asked for."""

from __future__ import annotations

import dataclasses
import logging
from typing import Any

import torch

from vitkit.errors import CheckpointError, VitkitError
from vitkit.model.info import ModelInfo
from vitkit.model.vit import VisionTransformer
from vitkit.weights.loading import load_state_dict_checked
from vitkit.weights.record import WeightsRecord, check_config_fits
from vitkit.weights.resampling import resize_model, resolve

# Overrides that change the loaded model rather than its config fields.
_SHAPE_OVERRIDES = ("num_classes", "img_size")
# The convolution that reads the image: a hybrid's ResNet root, a conv stem's first, else the
# patch embedding (a conv stem's proj is its 1x1 projection, read after its convs).
_INPUT_CONVS = ("patch_embed.backbone.stem.conv.weight", "patch_embed.convs.0.weight",
                "patch_embed.proj.weight")
log = logging.getLogger("vitkit.weights")


def build_model(weights: WeightsRecord, pos_interpolation: str | None = None,
                **overrides: Any) -> VisionTransformer:
    """Build the model, load the weights strictly, then apply `img_size` / `num_classes`.

    A new `img_size` resamples learned position embeddings with `pos_interpolation` (see
    `vitkit.weights.resampling`; None/"auto": the convention of the weights' format, e.g.
    "official" = vit_jax's corner-aligned bilinear for official .npz files, or the one a
    vitkit folder records). A new
    `num_classes` resets the head to zeros and drops the pre-logits layer, as the paper's
    fine-tuning does. Other overrides (dropout, drop_path, ...) must not change shapes.
    """
    resampling = resolve(pos_interpolation, weights.origin, weights.pos_interpolation)
    in_chans = overrides.pop("in_chans", weights.config.in_chans)
    if in_chans != weights.config.in_chans:
        weights = adapt_input_channels(weights, in_chans)
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
    model.info = ModelInfo(
        preprocess=preprocess, class_names=class_names,
        task=task,  # vitkit.tasks.task_of(model) reads it (None: classification)
        origin=weights.origin, weights_kind=weights.weights, eval_tta=eval_tta,
        # the weights' own convention ("auto"'s pick), which save_pretrained records
        pos_interpolation=resolve("auto", weights.origin, weights.pos_interpolation).name)
    return model.eval()


def adapt_input_channels(weights: WeightsRecord, in_chans: int) -> WeightsRecord:
    """The weights for images of `in_chans` channels, as timm's `adapt_input_conv` makes
    them from RGB ones: for one channel the input convolution summed over its three, for
    more its three repeated and scaled by 3 / in_chans; the preprocessing's mean and std
    follow (averaged, or repeated). With one mean and std for all three channels (the 0.5
    weights), a gray image then gives exactly what its RGB copy gives; with ImageNet's,
    nearly."""
    old = weights.config.in_chans
    if old != 3 or not isinstance(in_chans, int) or in_chans < 1:
        raise CheckpointError(f"in_chans={in_chans!r}: {_source(weights)} take {old} channel(s), "
                              "and only RGB weights are adapted to another count (as timm "
                              f"does); give images of {old} channel(s)")
    key = next((k for k in _INPUT_CONVS if k in weights.state_dict), None)
    if key is None:
        raise CheckpointError(f"in_chans={in_chans}: {_source(weights)} hold none of "
                              f"{', '.join(_INPUT_CONVS)}, so their input convolution cannot "
                              "be adapted; give images of 3 channels")
    kernel = weights.state_dict[key]
    pre = weights.preprocess
    mean3, std3 = (tuple(pre.mean) * 3)[:3], (tuple(pre.std) * 3)[:3]  # one value: all three
    if in_chans == 1:
        kernel = kernel.sum(dim=1, keepdim=True)
        mean, std = (sum(mean3) / 3,), (sum(std3) / 3,)
    else:
        repeats = -(-in_chans // 3)
        kernel = kernel.repeat(1, repeats, 1, 1)[:, :in_chans] * (3 / in_chans)
        mean, std = (mean3 * repeats)[:in_chans], (std3 * repeats)[:in_chans]
    log.info("%s: the input convolution adapted from 3 channels to %d (%s), as timm's "
             "adapt_input_conv does", _source(weights), in_chans,
             "summed over them" if in_chans == 1 else f"repeated, scaled by 3/{in_chans}")
    return dataclasses.replace(
        weights, config=weights.config.replace(in_chans=in_chans),
        state_dict={**weights.state_dict, key: kernel.contiguous()},
        preprocess=pre.replace(mean=mean, std=std))


def _source(weights: WeightsRecord) -> str:
    where = f" of {weights.path}" if weights.path is not None else ""
    return f"the {weights.origin} weights{where}"
