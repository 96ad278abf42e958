"""Test-time augmentation (TTA): a model's outputs averaged over each image and its mirror
image (a horizontal flip), the evaluation fast CIFAR-10 trainers use. It costs a second
forward pass per image and needs no retraining; a model trained with random flips sees both
views as the same class. Training (`tta` in the recipe), `vitkit eval` and `vitkit predict`
take it (`--tta flip`); eval and predict default to what the training run recorded (its
recipe, or the `eval_tta` a saved model folder keeps), so a run's own score is reproduced."""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from vitkit.preprocess import TTA_MODES, check_tta

__all__ = ["TTA_HELP", "TTA_MODES", "FlipAveraged", "check_tta", "recorded_tta",
           "unflipped_training_warning", "warn_if_never_flipped", "with_tta"]

log = logging.getLogger(__name__)

TTA_HELP = ("test-time augmentation: flip averages the outputs on each image and its mirror "
            "image (2 forward passes); none (default: what the training run used)")


class FlipAveraged(nn.Module):
    """`model`'s outputs on a batch and on its horizontal mirror image, averaged (logits for
    classification and multi-label, standardised values for regression)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return (self.model(images) + self.model(images.flip(-1))) / 2


def with_tta(model: nn.Module, tta: str) -> nn.Module:
    """`model` evaluated with test-time augmentation `tta` (itself for "none")."""
    return FlipAveraged(model) if check_tta(tta) == "flip" else model


def recorded_tta(requested: str | None, recorded: str = "none") -> str:
    """The TTA to evaluate with: `requested`, else the one the weights were evaluated with
    when trained (`WeightsRecord.eval_tta`: the run's recipe, or a saved folder's)."""
    return check_tta(requested if requested is not None else recorded)


def unflipped_training_warning(tta: str, train_config: Mapping[str, Any] | None,
                               pictures: bool = True) -> str | None:
    """Why flip TTA may cost accuracy: the training run (`train_config`, its recipe) never
    flipped its inputs (`augment.flip=false`; float arrays, `pictures` False, flip only when
    asked), so the mirror images are inputs the model never saw (a digit's mirror image is no
    digit, and a digits model scores far lower with flip TTA). None for other TTA, a run that
    flipped, or weights without a recipe."""
    if tta != "flip" or not isinstance(train_config, Mapping):
        return None
    augment = train_config.get("augment")
    flipped = augment.get("flip", pictures) if isinstance(augment, Mapping) else pictures
    if flipped:
        return None
    return ("flip TTA averages each input with its mirror image, but the training run never "
            "flipped its inputs (augment.flip=false), so the mirror images are new to the "
            "model and can cost accuracy: use --tta none, or train with augment.flip=true")


def warn_if_never_flipped(tta: str, train_config: Mapping[str, Any] | None,
                          pictures: bool = True) -> None:
    """Log `unflipped_training_warning`'s warning, when there is one (on stderr: a verb's
    --json output stays JSON)."""
    caution = unflipped_training_warning(tta, train_config, pictures)
    if caution:
        log.warning("%s", caution)
