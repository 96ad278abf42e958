"""Hugging Face datasets beyond classes: a float column gives regression targets, a
Sequence(ClassLabel) (or list of integers) column multi-hot targets named by the ClassLabel
names; in memory and streamed from the files (map-style), offline, from save_to_disk folders."""

from __future__ import annotations

import io
from pathlib import Path

import datasets
import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Features, Sequence, Value
from datasets import Image as HFImage
from PIL import Image

from vitkit.data.feeds import evaluation_feed, training_feed
from vitkit.data.loader import BatchOrder
from vitkit.data.sources import open_source
from vitkit.data.sources.hf import load_hf_splits
from vitkit.data.transforms import InceptionCrop, evaluation_preprocess
from vitkit.errors import DataError
from vitkit.tasks import infer_task

LABELS = ["cat", "dog", "sky"]


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def _png(seed: int) -> dict:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(12, 12, 3), dtype=np.uint8)
    buffer = io.BytesIO()
    Image.fromarray(pixels).save(buffer, format="PNG")
    return {"bytes": buffer.getvalue(), "path": None}


def _save(root: Path, column: str, feature, values: list) -> Path:
    features = Features({"image": HFImage(), column: feature})
    whole = Dataset.from_dict({"image": [_png(i) for i in range(len(values))],
                               column: values}, features=features)
    DatasetDict(train=whole.select(range(6)), test=whole.select(range(6, len(values)))
                ).save_to_disk(str(root))
    datasets.disable_progress_bars()
    return root


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_float_column_gives_regression_targets(tmp_path: Path, mode) -> None:
    values = np.random.default_rng(0).normal(size=9).round(3).tolist()
    root = _save(tmp_path / "r", "mass", Value("float64"), values)
    train, test = open_source(f"hf:{root}", image_size=(12, 12), channels=3, mode=mode,
                              workers=0)
    assert train.classes == test.classes == ["mass"]
    labels = torch.as_tensor(np.asarray(train.labels))
    assert labels.dtype == torch.float32 and labels.shape == (6, 1)
    assert np.allclose(labels[:, 0].numpy(), values[:6])
    assert infer_task(labels, None, train.classes).kind == "regression"
    feed = training_feed(train, BatchOrder(6, 3, seed=1), InceptionCrop((12, 12)), 3,
                         (12, 12), seed=1, workers=0)
    order = BatchOrder(6, 3, seed=1).epoch_indices(0)
    got = torch.cat([y for _, _, y in feed.epoch(0)])
    feed.close()
    assert torch.equal(got, labels[order])
    evaluation = evaluation_feed(test, evaluation_preprocess((12, 12), 3, False, 1.0), 3,
                                 workers=0)
    assert np.allclose(torch.cat([y for _, y in evaluation.eval_batches(2)])[:, 0].numpy(),
                       values[6:])


@pytest.mark.parametrize("feature", [Sequence(ClassLabel(names=LABELS)),
                                     Sequence(Value("int64"))])
def test_label_lists_give_multi_hot_targets(tmp_path: Path, feature) -> None:
    lists = [[0, 2], [1], [], [2, 1, 0], [0], [1, 2], [2], [0, 1], []]
    root = _save(tmp_path / "m", "labels", feature, lists)
    train, test = load_hf_splits(str(root))
    names = LABELS if isinstance(feature.feature, ClassLabel) else ["0", "1", "2"]
    assert train.classes == test.classes == names
    hot = np.zeros((9, 3), np.float32)
    for row, labels in enumerate(lists):
        hot[row, labels] = 1
    assert train.labels.dtype == np.float32 and np.array_equal(train.labels, hot[:6])
    assert np.array_equal(test.labels, hot[6:])
    memory, _ = open_source(f"hf:{root}", image_size=(12, 12), mode="memory", workers=0)
    assert torch.equal(memory.labels, torch.from_numpy(hot[:6]))
    assert infer_task(memory.labels, "multilabel", memory.classes).names == names


def test_targets_beyond_classes_are_refused_when_streamed_or_broken(tmp_path: Path) -> None:
    root = _save(tmp_path / "r", "mass", Value("float32"), [0.5] * 9)
    with pytest.raises(DataError) as caught:
        load_hf_splits(str(root), streaming=True)
    says(str(caught.value), "float targets", "streaming=false")
    train, _ = load_hf_splits(str(root), streaming=False)  # the advice
    assert train.labels.shape == (6, 1)
    nan = _save(tmp_path / "n", "mass", Value("float32"), [0.5, None, 1, 2, 3, 4, 5, 6, 7])
    with pytest.raises(DataError) as caught:
        load_hf_splits(str(nan))
    says(str(caught.value), "1 value", "missing, NaN or inf", "index 1")
    negative = _save(tmp_path / "w", "labels", Sequence(Value("int64")),
                     [[0], [1, -1], *[[1]] * 7])
    with pytest.raises(DataError) as caught:
        load_hf_splits(str(negative))
    says(str(caught.value), "record 1", "'labels'", "[1, -1]")


@pytest.mark.parametrize("kind", ["lists", "integers"])
def test_counted_classes_are_the_largest_over_both_splits(tmp_path: Path, kind) -> None:
    """Integer labels (label lists or a plain integer column) name their classes by counting
    to the largest label of both splits, as data=arrays does: a test split that lacks the
    highest label is accepted."""
    if kind == "lists":
        values = [[k % 5] for k in range(6)] + [[k % 3] for k in range(4)]
        root = _save(tmp_path / "l", "labels", Sequence(Value("int64")), values)
    else:
        values = [k % 5 for k in range(6)] + [k % 3 for k in range(4)]
        root = _save(tmp_path / "i", "label", Value("int64"), values)
    train, test = load_hf_splits(str(root))
    assert train.classes == test.classes == ["0", "1", "2", "3", "4"]
    if kind == "lists":
        assert train.labels.shape == (6, 5) and test.labels.shape == (4, 5)
        assert test.labels[:, 3:].sum() == 0 and test.labels[:, :3].sum() == 4
    else:
        assert test.labels.tolist() == [0, 1, 2, 0]


def test_class_label_names_that_differ_are_still_refused_with_both_named(tmp_path: Path):
    features = {"train": ClassLabel(names=["cat", "dog"]), "test": ClassLabel(names=["x", "y"])}
    parts = {}
    for split, feature in features.items():
        parts[split] = Dataset.from_dict({"image": [_png(0), _png(1)], "label": [0, 1]},
                                         features=Features({"image": HFImage(),
                                                            "label": feature}))
    DatasetDict(parts).save_to_disk(str(tmp_path / "c"))
    with pytest.raises(DataError) as caught:
        load_hf_splits(str(tmp_path / "c"))
    says(str(caught.value), "['cat', 'dog']", "'test'", "['x', 'y']", "one labelling")


def test_a_counted_class_only_the_held_out_split_has_is_warned_of(tmp_path: Path,
                                                                   caplog) -> None:
    values = [k % 3 for k in range(6)] + [k % 5 for k in range(4)]
    root = _save(tmp_path / "i", "label", Value("int64"), values)
    with caplog.at_level("WARNING"):
        train, test = load_hf_splits(str(root))
    assert train.classes == test.classes == ["0", "1", "2", "3"]
    says(caplog.text, "class index(es) 3", "held-out split", "never in training",
         "never trained")
