"""The augmentations a task trains with: regression leaves flip and crop off unless they are
set (they move a position target), and a recipe's flip or zoomed crop on a regression is
warned of, naming only what applies to the data (arrays have no crop padding); followed,
the warning goes."""

from __future__ import annotations

import logging
import re

from vitkit.tasks import TaskSpec
from vitkit.train.config import load_train_config
from vitkit.train.data import augment_config


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def test_regression_on_pictures_leaves_flip_and_crop_off_unless_set(caplog):
    regression, classes = TaskSpec("regression"), TaskSpec("classification")
    plain = load_train_config(None, ["data=folder"])  # TrainConfig's defaults
    with caplog.at_level(logging.INFO):
        augment = augment_config(plain, streamed=False, task=regression)
    assert not augment.flip and augment.crop_padding == 0
    says(caplog.text, "task=regression", "augment.flip", "augment.crop_padding", "off")
    asked = load_train_config(None, ["data=folder", "augment.flip=true",
                                     "augment.crop_padding=4"])
    augment = augment_config(asked, streamed=False, task=regression)
    assert augment.flip and augment.crop_padding == 4  # the advice followed
    augment = augment_config(plain, streamed=False, task=classes)
    assert augment.flip and augment.crop_padding == 4  # classification keeps its defaults
    tuning = load_train_config("finetune", ["data=folder", "init_from=weights"])
    augment_config(tuning, streamed=False, task=regression)  # the recipe flips and crops
    says(caplog.text, "task=regression", "augment.flip=true", "resize_crop=1.33")


def test_regression_on_float_arrays_warns_of_the_recipes_flip_and_zoomed_crop(caplog):
    """A regression fine-tuned on float arrays with the finetune recipe's flip and zoomed crop
    is warned of as pictures are, naming only what applies to arrays; followed, the warning
    goes."""
    regression = TaskSpec("regression")
    tuning = load_train_config("finetune", ["data=arrays", "init_from=weights"])
    with caplog.at_level(logging.INFO):
        augment = augment_config(tuning, streamed=False, task=regression, float_images=True)
    assert augment.flip and augment.crop_padding == 0
    says(caplog.text, "task=regression", "augment.flip=true", "resize_crop=1.33")
    advice = re.search(r"\bset (augment\..*)$", caplog.text, re.MULTILINE).group(1)
    assert advice == "augment.flip=false and resize_crop=1"  # no crop padding for arrays
    caplog.clear()
    followed = load_train_config("finetune", ["data=arrays", "init_from=weights",
                                              *advice.split(" and ")])
    with caplog.at_level(logging.INFO):
        augment = augment_config(followed, streamed=False, task=regression, float_images=True)
    assert not augment.flip and "warning" not in caplog.text
    plain = load_train_config(None, ["data=arrays"])
    with caplog.at_level(logging.INFO):
        augment_config(plain, streamed=False, task=regression, float_images=True)
    says(caplog.text, "task=regression", "augment.flip off", "augment.flip=true")
