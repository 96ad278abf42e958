"""data=folder with a targets table: `<split>/targets.csv` (`file,<name>,...`) gives float32
(N, K) targets named by its columns, in memory and streamed, and bad tables are refused by
line, column and value."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data.feeds import evaluation_feed, record_count, training_feed
from vitkit.data.loader import BatchOrder
from vitkit.data.sources import open_source
from vitkit.data.sources.table import TableRecords
from vitkit.data.transforms import InceptionCrop, evaluation_preprocess
from vitkit.errors import DataError
from vitkit.tasks import infer_task


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def _table_folder(root: Path, columns=("mass", "spin"), binary: bool = False,
                  broken: bool = False) -> dict[str, np.ndarray]:
    """root/train (6 images, in sub-folders) and root/val (3) with targets.csv; the targets."""
    rng = np.random.default_rng(0)
    written = {}
    for split, count in (("train", 6), ("val", 3)):
        folder = root / split
        (folder / "fields").mkdir(parents=True)
        values = (rng.integers(0, 2, size=(count, len(columns))) if binary
                  else rng.normal(size=(count, len(columns))).round(4))
        lines = ["file," + ",".join(columns)]
        for i in range(count):
            name = f"fields/{i}.png"
            pixels = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / name)
            lines.append(f"{name}," + ",".join(str(v) for v in values[i]))
        if broken and split == "train":
            (folder / "fields" / "bad.png").write_bytes(b"not a png")
            lines.insert(3, "fields/bad.png," + ",".join("7" for _ in columns))
        (folder / "targets.csv").write_text("\n".join(lines) + "\n")
        written[split] = values.astype(np.float32)
    return written


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_targets_come_from_the_table(tmp_path: Path, mode) -> None:
    targets = _table_folder(tmp_path)
    train, val = open_source("folder", str(tmp_path), (16, 16), 3, mode=mode)
    assert train.classes == val.classes == ["mass", "spin"]
    assert train.streamed == (mode == "stream")
    labels = torch.as_tensor(np.asarray(train.labels))
    assert labels.dtype == torch.float32 and torch.equal(labels, torch.from_numpy(targets["train"]))
    order = BatchOrder(record_count(train), batch_size=2, seed=3)
    feed = training_feed(train, order, InceptionCrop((16, 16)), 3, (16, 16), seed=3, workers=0)
    for index, images, batch_labels in feed.epoch(1, start_batch=1):
        wanted = order.epoch_indices(1)[index * 2:(index + 1) * 2]
        assert images.shape == (2, 3, 16, 16)
        assert torch.equal(batch_labels, torch.from_numpy(targets["train"])[wanted])
    feed.close()
    evaluation = evaluation_feed(val, evaluation_preprocess((16, 16), 3, False, 1.0), 3,
                                 workers=0)
    got = torch.cat([y for _, y in evaluation.eval_batches(2)])
    assert torch.equal(got, torch.from_numpy(targets["val"]))
    assert torch.equal(evaluation.labels, got)
    assert infer_task(labels).kind == "regression"


def test_binary_columns_are_multilabel_targets_and_broken_rows_drop_their_targets(
        tmp_path: Path) -> None:
    targets = _table_folder(tmp_path, ("cat", "dog", "sky"), binary=True, broken=True)
    train, _ = open_source("folder", str(tmp_path), (16, 16), 3, mode="memory")
    assert train.skipped == 1 and train.labels.dtype == torch.float32
    assert torch.equal(train.labels, torch.from_numpy(targets["train"]))  # bad.png's row gone
    assert infer_task(train.labels, "multilabel", train.classes).names == ["cat", "dog", "sky"]
    streamed, _ = open_source("folder", str(tmp_path), (16, 16), 3, mode="stream",
                              train_limit=3)
    assert isinstance(streamed, TableRecords) and len(streamed) == 3
    feed = training_feed(streamed, BatchOrder(3, 3, shuffle=False), InceptionCrop((16, 16)),
                         3, (16, 16), seed=0, workers=0)
    (_, images, labels), = list(feed.epoch(0))
    assert len(images) == 2 and labels.shape == (2, 3)  # bad.png left out, with its targets
    assert torch.equal(labels, torch.from_numpy(targets["train"][:2]))
    assert [Path(p).name for p, _ in feed.skipped_files] == ["bad.png"]


def _refused(root: Path, train_lines: list[str], val_lines: list[str] | None = None) -> str:
    _table_folder(root)
    (root / "train" / "targets.csv").write_text("\n".join(train_lines) + "\n")
    if val_lines is not None:
        (root / "val" / "targets.csv").write_text("\n".join(val_lines) + "\n")
    with pytest.raises(DataError) as caught:
        open_source("folder", str(root), (16, 16), 3, mode="memory")
    return str(caught.value)


def test_bad_tables_are_refused_by_line_column_and_value(tmp_path: Path) -> None:
    missing = _refused(tmp_path / "a", ["file,mass,spin", "fields/0.png,1,2",
                                        "fields/9.png,1,2"])
    says(missing, "line 3", "'fields/9.png'", "does not exist")
    mixed = _refused(tmp_path / "b", ["file,mass,spin", "fields/0.png,1,2",
                                      "fields/1.png,heavy,2"])
    says(mixed, "line 3", "'mass'", "'heavy'", "not a number")
    says(_refused(tmp_path / "c", ["path,mass", "fields/0.png,1"]), "`file` column",
         "path,mass")
    assert "a header but no rows" in _refused(tmp_path / "d", ["file,mass,spin"])
    other = _refused(tmp_path / "e", ["file,mass,spin", "fields/0.png,1,2"],
                     ["file,mass,charge", "fields/0.png,1,2"])
    assert "mass, charge" in other and "mass, spin" in other and "same columns" in other
    says(_refused(tmp_path / "f", ["file,mass", "fields/0.png,nan"]), "'nan'",
         "not a finite number")
    says(_refused(tmp_path / "g", ["file,mass,spin", "fields/0.png,1"]), "2 values",
         "header", "3")
    _table_folder(tmp_path / "h")
    table = (tmp_path / "h" / "val" / "targets.csv").read_text()
    (tmp_path / "h" / "val" / "targets.csv").unlink()
    with pytest.raises(DataError) as caught:
        open_source("folder", str(tmp_path / "h"), (16, 16), 3, mode="memory")
    says(str(caught.value), "val", "no targets.csv", "write one", "val/")
    (tmp_path / "h" / "val" / "targets.csv").write_text(table)  # the advice: write one
    assert len(open_source("folder", str(tmp_path / "h"), (16, 16), 3, mode="memory")[1]) == 3


def test_following_the_missing_file_message_works(tmp_path: Path) -> None:
    message = _refused(tmp_path, ["file,mass,spin", "fields/0.png,1,2", "fields/00.png,2,3"])
    says(message, "fields/00.png", "fix the path", "relative to the table's folder")
    (tmp_path / "train" / "targets.csv").write_text("file,mass,spin\nfields/0.png,1,2\n"
                                                    "fields/1.png,2,3\n")
    train, _ = open_source("folder", str(tmp_path), (16, 16), 3, mode="memory")
    assert train.labels.tolist() == [[1.0, 2.0], [2.0, 3.0]]


def _class_table(root: Path, train_values: list[str], val_values: list[str],
                 columns: str = "label") -> None:
    """`_table_folder`'s images (6 train, 3 val) with targets.csv rows of `*_values`."""
    _table_folder(root, tuple(columns.split(",")))
    for split, values in (("train", train_values), ("val", val_values)):
        lines = [f"file,{columns}", *(f"fields/{i}.png,{v}" for i, v in enumerate(values))]
        (root / split / "targets.csv").write_text("\n".join(lines) + "\n")


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_one_column_of_class_indices_gives_class_labels_for_task_classification(
        tmp_path: Path, mode, caplog) -> None:
    """Whole numbers from 0 (written 2 or 2.0) are int64 class labels when the run asks for
    task=classification, their classes "0".."K-1" with K from both splits (3 occurs only in
    val/, 1 is absent from val/ and no warning calls it unreadable); without the task the
    same table gives float32 (N, 1) targets."""
    _class_table(tmp_path, ["0", "2", "1", "0", "2.0", "0"], ["3", "0", "2"])
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        train, val = open_source("folder", str(tmp_path), (16, 16), 3, mode=mode,
                                 task="classification")
    assert "no readable images" not in caplog.text  # (decoded into memory: not streamed)
    assert train.classes == val.classes == ["0", "1", "2", "3"]
    labels = torch.as_tensor(np.asarray(train.labels))
    assert labels.dtype == torch.int64 and labels.tolist() == [0, 2, 1, 0, 2, 0]
    assert infer_task(labels, "classification").kind == "classification"
    evaluation = evaluation_feed(val, evaluation_preprocess((16, 16), 3, False, 1.0), 3,
                                 workers=0)
    got = torch.cat([y for _, y in evaluation.eval_batches(2)])
    assert got.dtype == torch.int64 and got.tolist() == [3, 0, 2]
    order = BatchOrder(record_count(train), batch_size=3, seed=1)
    feed = training_feed(train, order, InceptionCrop((16, 16)), 3, (16, 16), seed=1, workers=0)
    batches = [y for _, _, y in feed.epoch(0)]
    feed.close()
    assert torch.cat(batches).sort().values.tolist() == [0, 0, 0, 1, 2, 2]
    floats, _ = open_source("folder", str(tmp_path), (16, 16), 3, mode=mode)
    assert torch.as_tensor(np.asarray(floats.labels)).shape == (6, 1)
    assert floats.classes == ["label"]


@pytest.mark.parametrize("train_values, val_values, columns", [
    (["0", "1.5", "1", "0", "2", "0"], ["1", "0", "2"], "label"),  # a fraction
    (["0", "1", "-1", "0", "2", "0"], ["1", "0", "2"], "label"),  # a negative value
    (["0,1", "1,0", "1,1", "0,0", "1,0", "0,1"], ["1,0", "0,1", "1,1"], "cat,dog"),  # 2 columns
])
def test_other_tables_stay_float_and_task_classification_names_the_tasks_they_fit(
        tmp_path: Path, train_values, val_values, columns) -> None:
    _class_table(tmp_path, train_values, val_values, columns)
    train, _ = open_source("folder", str(tmp_path), (16, 16), 3, mode="memory",
                           task="classification")
    assert train.labels.dtype == torch.float32 and train.classes == columns.split(",")
    with pytest.raises(DataError) as caught:
        infer_task(train.labels, "classification")
    says(str(caught.value), "task=classification", "non-negative integer class indices",
         "task=regression", "task=multilabel")
    assert infer_task(train.labels, "regression").kind == "regression"  # the advice


def test_a_held_out_value_that_is_no_class_index_is_refused_by_its_row(tmp_path: Path) -> None:
    _class_table(tmp_path, ["0", "1", "1", "0", "2", "0"], ["1", "2.5", "2"])
    with pytest.raises(DataError) as caught:
        open_source("folder", str(tmp_path), (16, 16), 3, mode="memory", task="classification")
    message = str(caught.value)
    says(message, str(tmp_path / "val" / "targets.csv"), "fields/1.png", "2.5",
         str(tmp_path / "train" / "targets.csv"), "class indices", "task=classification",
         "the class index of its image", "drop the row")
    assert "\n" not in message
    _class_table(tmp_path / "fixed", ["0", "1", "1", "0", "2", "0"], ["1", "2", "2"])
    _, val = open_source("folder", str(tmp_path / "fixed"), (16, 16), 3, mode="memory",
                         task="classification")
    assert val.labels.tolist() == [1, 2, 2]


def test_class_indices_most_of_which_never_occur_are_refused_and_one_based_ones_warned(
        tmp_path: Path, caplog) -> None:
    _class_table(tmp_path / "ids", ["0", "1000", "0", "1000", "0", "1000"], ["0", "1000", "0"])
    with pytest.raises(DataError) as caught:
        open_source("folder", str(tmp_path / "ids"), (16, 16), 3, mode="stream",
                    task="classification")
    message = str(caught.value)
    says(message, str(tmp_path / "ids" / "train" / "targets.csv"), "1000", "only 2",
         "1001 outputs", "never trained", "number the classes 0..1")
    assert "\n" not in message
    _class_table(tmp_path / "fixed", ["0", "1", "0", "1", "0", "1"], ["0", "1", "0"])  # advice
    train, _ = open_source("folder", str(tmp_path / "fixed"), (16, 16), 3, mode="stream",
                           task="classification")
    assert train.classes == ["0", "1"]
    _class_table(tmp_path / "one_based", ["1", "2", "3", "1", "2", "3"], ["1", "2", "3"])
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        train, _ = open_source("folder", str(tmp_path / "one_based"), (16, 16), 3,
                               mode="stream", task="classification")
    assert train.classes == ["0", "1", "2", "3"]
    says(caplog.text, "class index(es) 0", "never trained", "counted from 1",
         "number the classes from 0")
    caplog.clear()
    _class_table(tmp_path / "zero_based", ["0", "1", "2", "0", "1", "2"], ["0", "1", "2"])
    with caplog.at_level(logging.WARNING, logger="vitkit"):  # the advice: numbered from 0
        train, _ = open_source("folder", str(tmp_path / "zero_based"), (16, 16), 3,
                               mode="stream", task="classification")
    assert train.classes == ["0", "1", "2"] and "never trained" not in caplog.text


def test_images_beside_the_table_without_a_row_are_warned_of(tmp_path: Path, caplog) -> None:
    """An image the table has no row for is left out, and the log says so."""
    _table_folder(tmp_path)
    Image.new("RGB", (16, 16)).save(tmp_path / "train" / "extra.png")
    with caplog.at_level(logging.WARNING):
        train, _ = open_source("folder", str(tmp_path), (16, 16), mode="stream")
    assert len(train) == 6
    says(caplog.text, str(tmp_path / "train"), "1 image(s)", "targets.csv", "no row",
         "extra.png", "add a row", "move them out")
    table = tmp_path / "train" / "targets.csv"
    table.write_text(table.read_text() + "extra.png,0.5,0.5\n")  # the advice followed
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train, _ = open_source("folder", str(tmp_path), (16, 16), mode="stream")
    assert len(train) == 7 and "have no row" not in caplog.text


def test_images_in_the_tables_sub_folders_without_a_row_are_warned_of(tmp_path: Path,
                                                                      caplog) -> None:
    """In the layout the docs show (images in a sub-folder, train/fields/*.png), an image
    there without a row is left out, and the log names it."""
    _table_folder(tmp_path)
    table = tmp_path / "train" / "targets.csv"
    rows = table.read_text().splitlines()
    table.write_text("\n".join(rows[:-1]) + "\n")  # fields/5.png loses its row
    with caplog.at_level(logging.WARNING):
        train, _ = open_source("folder", str(tmp_path), (16, 16), mode="stream")
    assert len(train) == 5
    says(caplog.text, "1 image(s)", "no row", "fields/5.png")
    table.write_text("\n".join(rows) + "\n")  # the advice followed: its row added back
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train, _ = open_source("folder", str(tmp_path), (16, 16), mode="stream")
    assert len(train) == 6 and "have no row" not in caplog.text


def test_a_file_named_by_two_rows_is_warned_of(tmp_path: Path, caplog) -> None:
    """A table naming one file twice is read with a warning naming the file and its lines,
    advising to drop the extra rows."""
    _table_folder(tmp_path)
    table = tmp_path / "train" / "targets.csv"
    rows = table.read_text().splitlines()
    table.write_text("\n".join([*rows, "fields/0.png,9.0,9.0"]) + "\n")
    with caplog.at_level(logging.WARNING):
        train, _ = open_source("folder", str(tmp_path), (16, 16), mode="stream")
    assert len(train) == 7
    says(caplog.text, "1 file(s)", "more than one row", "fields/0.png", "lines 2, 8",
         "drop the extra rows")
    table.write_text("\n".join(rows) + "\n")  # the advice followed
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        train, _ = open_source("folder", str(tmp_path), (16, 16), mode="stream")
    assert len(train) == 6 and "more than one row" not in caplog.text


def test_images_shared_outside_the_split_folders_are_not_called_unlisted(tmp_path: Path,
                                                                        caplog) -> None:
    """Both tables name files in one ../images folder: no split calls the other's images
    unlisted (so no advice to add held-out images to training)."""
    images = tmp_path / "images"
    images.mkdir()
    for i in range(6):
        Image.new("RGB", (16, 16), (i, i, i)).save(images / f"{i}.png")
    for split, files in (("train", range(4)), ("val", range(4, 6))):
        (tmp_path / split).mkdir()
        (tmp_path / split / "targets.csv").write_text(
            "file,mass\n" + "".join(f"../images/{i}.png,{i}.0\n" for i in files))
    with caplog.at_level(logging.WARNING):
        train, held_out = open_source("folder", str(tmp_path), (16, 16), mode="stream")
    assert (len(train), len(held_out)) == (4, 2)
    assert "have no row" not in caplog.text


def test_a_table_whose_header_repeats_a_column_is_refused(tmp_path: Path) -> None:
    from PIL import Image

    from vitkit.data.sources.table import read_table

    split = tmp_path / "train"
    split.mkdir()
    Image.new("RGB", (8, 8)).save(split / "a.png")
    (split / "targets.csv").write_text("file,mass,mass\na.png,1.0,2.0\n")
    with pytest.raises(DataError) as caught:
        read_table(split)
    says(str(caught.value), "mass", "more than once", "a name of its own")
    (split / "targets.csv").write_text("file,mass,spin\na.png,1.0,2.0\n")  # the advice
    assert read_table(split)[1] == ["mass", "spin"]
