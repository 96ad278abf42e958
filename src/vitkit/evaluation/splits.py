"""Which data and split weights are evaluated on: as given, else as the training run that
made them recorded it (its data, folder, image limit and reading mode), so a run's own score is
reproduced. `vitkit eval` and the frozen-feature protocols read their images through here."""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

from vitkit.data.array_inputs import to_uint8_advice
from vitkit.data.feeds import EvaluationFeed, evaluation_feed
from vitkit.data.sources import (
    SOURCES,
    open_held_out_only,
    open_source,
)
from vitkit.errors import DataError, MissingSplit
from vitkit.tasks import make_task
from vitkit.weights import WeightsRecord
from vitkit.weights.formats.train_checkpoint import data_dir_from_here

log = logging.getLogger("vitkit.evaluation")

HELD_OUT_NAMES = ("val", "validation")  # --split names of the held-out split, beside test


def data_for(weights: WeightsRecord, data: str | None, data_dir: str | None, split: str,
             limit: int | str | None) -> tuple[str, str | None, int | None]:
    """(data, data_dir, limit) to evaluate on: as given, else as the training run recorded
    (its data, folder and image limit, so a run's own score is reproduced).
    `limit="all"`: every image of the split, whatever the run read."""
    recipe: dict[str, Any] = weights.train_config or {}
    if data is None:
        data = recipe.get("data")
        if data is None:
            raise DataError(
                f"{weights.path} does not record the data it was trained on (only vitkit "
                f"training checkpoints do): pass the data to evaluate on, e.g. --data digits, "
                f"or --data cifar10 --data-dir DIR (one of {', '.join(SOURCES)})")
        if limit is None:
            limit = recipe.get(recorded_limit_key(split))
    if limit == "all":
        limit = None
    if data_dir is None and data == recipe.get("data"):
        data_dir = data_dir_from_here(recipe, weights.path,
                                      trained_in=weights.trained_in).get("data_dir")
    return data, data_dir, limit


def recorded_limit_key(split: str) -> str:
    """The training recipe's key that limits `split`'s images (a named Hugging Face split is
    read as the held-out one)."""
    return "train_limit" if split == "train" else "test_limit"


def split_to_evaluate(weights: WeightsRecord, data: str, data_dir: str | None, split: str,
                       limit: int | None, size: tuple[int, int], channels: int,
                       check_first: Callable[[EvaluationFeed], None] | None = None,
                       named: bool = False) -> tuple[EvaluationFeed, str]:
    """The split to evaluate, and its name for reports ("train", "test", or a Hugging Face
    dataset's split as it is called): in memory, or streamed through the weights' own
    preprocessing;
    refused when its images are in other units than the weights' (`check_same_units`), after
    `check_first` (the caller's checks whose messages say more, such as the targets').

    Folders and Hugging Face datasets are streamed (each image resized and cropped as the
    weights expect), except that a vitkit run's own data is read as the run read it (its
    `data_mode`), so its score is reproduced. `split`: "train", "test" (the held-out split:
    val/ or test/ of a folder, or the class sub-folders of one without train/; the run's
    `split` or validation/test of a Hugging Face dataset; "val" names it too, except for a
    Hugging Face dataset) or, for a Hugging Face dataset, any split name it has. `named`:
    the user named the split (`--split test`): a Hugging Face dataset's split called test is
    then read, where it has one, rather than the held-out split (validation, when it has
    both).
    """
    recipe = weights.train_config or {}
    own = data == recipe.get("data")
    streamable = data == "folder" or data.startswith("hf:")
    mode = recipe.get("data_mode", "auto") if own else ("stream" if streamable else "auto")
    train_split = recipe.get("train_split") if own else None
    eval_split = recipe.get("split") if own else None
    held_out = eval_split
    literal_test = named and split == "test" and data.startswith("hf:")
    if split in HELD_OUT_NAMES and not data.startswith("hf:"):
        split = "test"  # a folder's val/, arrays' val.npz: the held-out split
    if split not in ("train", "test") or literal_test:
        if not data.startswith("hf:"):
            raise DataError(f"--split {split}: {data} has the splits train and test (val: "
                            "the same held-out split); other split names are for Hugging "
                            "Face datasets (--data hf:NAME)")
        eval_split, split = split, "test"
    task = make_task(weights.task).kind

    def opened(eval_split: str | None) -> tuple[Any, Any]:
        return open_source(data, data_dir, size, channels, limit if split == "train" else None,
                           limit if split == "test" else None, mode, train_split, eval_split,
                           bool(recipe.get("streaming")) if own else False, task=task)

    chosen = (open_held_out_only(data, data_dir, size, channels, limit, mode, task=task)
              if split == "test" else None)  # a folder of test images only, or arrays
    if chosen is None:
        try:
            train_set, test_set = opened(eval_split)
        except MissingSplit:
            if not literal_test:
                raise
            train_set, test_set = opened(held_out)  # no split named test: the held-out one
            log.info("%s has no split named test: its held-out split is read", data)
        chosen = train_set if split == "train" else test_set
    feed = evaluation_feed(chosen, weights.preprocess.replace(img_size=list(size)), channels)
    if check_first is not None:
        check_first(feed)
    check_same_units(bool(getattr(chosen, "float_images", False)), weights.preprocess.scale,
                     data_dir or data, getattr(chosen, "stored_dtype", ""))
    read = str(getattr(chosen, "name", "")).rsplit(" ", 1)[-1] if data.startswith("hf:") \
        and split == "test" else split  # a Hugging Face split by its name: "hf:SPEC NAME"
    return feed, read or split


def check_same_units(float_images: bool, scale: float, where: str,
                     stored_dtype: str = "") -> None:
    """Refuse 8-bit pictures (folders, CIFAR, the digits, Hugging Face images) for weights
    trained on arrays in their data's own units (scale 1), whose 0-255 values would be read
    as those units, and arrays stored as anything but uint8 (`stored_dtype`) for weights of
    8-bit pictures (scale 255), whose values are not 0-255: as predict refuses such files."""
    if stored_dtype and stored_dtype != "uint8" and scale == 255:
        raise DataError(f"{where} holds {stored_dtype} arrays, but the weights were trained on "
                        "8-bit pictures (their preprocessing divides by 255), so the arrays' "
                        "values would be misread as 0-255: save them as uint8 arrays of 0-255 "
                        f"({to_uint8_advice(stored_dtype)}), or evaluate weights trained "
                        "on these arrays")
    if not float_images and scale != 255:
        raise DataError(f"{where} holds 8-bit pictures, but the weights were trained on arrays "
                        f"in their data's own units (their preprocessing divides by {scale:g}, "
                        "not 255), so the pictures' values would be misread as those units: "
                        "evaluate them on arrays in those units (data=arrays), or evaluate "
                        "weights trained on pictures")
