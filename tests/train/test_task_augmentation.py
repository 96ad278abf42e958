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


def test_regression_on_pictures_leaves_flip_and_crop_off_unless_set(caplog):
    regression, classes = TaskSpec("regression"), TaskSpec("classification")
    plain = load_train_config(None, ["data=folder"])  # TrainConfig's defaults
    with caplog.at_level(logging.INFO):
        augment = augment_config(plain, streamed=False, task=regression)
    assert not augment.flip and augment.crop_padding == 0
    assert "task=regression: augment.flip and augment.crop_padding off" in caplog.text
    asked = load_train_config(None, ["data=folder", "augment.flip=true",
                                     "augment.crop_padding=4"])
    augment = augment_config(asked, streamed=False, task=regression)
    assert augment.flip and augment.crop_padding == 4  # the advice followed
    augment = augment_config(plain, streamed=False, task=classes)
    assert augment.flip and augment.crop_padding == 4  # classification keeps its defaults
    tuning = load_train_config("finetune", ["data=folder", "init_from=weights"])
    augment_config(tuning, streamed=False, task=regression)  # the recipe flips and crops
    assert "task=regression with augment.flip=true, resize_crop=1.33 (set by the recipe or " \
        "by you)" in caplog.text


def test_regression_on_float_arrays_warns_of_the_recipes_flip_and_zoomed_crop(caplog):
    """Fine-tuning a regression on arrays took the finetune recipe's flip and resize_crop
    without a word (a blob's x position: R^2 0.004, 0.64 without the flip, 0.88 without
    both); pictures warned. Now arrays warn alike, naming only what applies to them."""
    regression = TaskSpec("regression")
    tuning = load_train_config("finetune", ["data=arrays", "init_from=weights"])
    with caplog.at_level(logging.INFO):
        augment = augment_config(tuning, streamed=False, task=regression, float_images=True)
    assert augment.flip and augment.crop_padding == 0
    assert "task=regression with augment.flip=true, resize_crop=1.33 (set by the recipe or " \
        "by you)" in caplog.text
    advice = re.search(r"where they do, set (.*)$", caplog.text, re.MULTILINE).group(1)
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
    assert "task=regression: augment.flip off" in caplog.text
    assert "set augment.flip=true where" in caplog.text
