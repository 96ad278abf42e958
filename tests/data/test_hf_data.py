"""Hugging Face datasets as a data source (`data=hf:SPEC`): every kind of SPEC loads real images
with the right classes, labels, splits and pixels; streaming shards, skips and reshuffles
exactly; every failure is a `DataError` whose advice works. The network is never used: each test
runs offline with HF_HOME in its own tmp folder."""

from __future__ import annotations

import io
import json
import logging
import re
import shutil
from pathlib import Path

import datasets
import huggingface_hub.constants
import numpy as np
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Value, concatenate_datasets
from datasets import Image as HFImage
from datasets.packaged_modules.parquet.parquet import Parquet
from PIL import Image

from vitkit.data.sources import hf as hf_source
from vitkit.data.sources.digits import load_digits
from vitkit.data.sources.hf import load_hf_split, load_hf_splits
from vitkit.data.sources.records import ImageRecords, IterableRecords
from vitkit.errors import DataError


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


NAMES = [f"digit-{d}" for d in range(10)]  # ClassLabel names, distinct from "0".."9"


@pytest.fixture(autouse=True)
def offline_hf_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """HF_HOME in tmp and offline, in the environment and in the already-read configs."""
    home = tmp_path / "hf_home"
    for name, value in {"HF_HOME": str(home), "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1",
                        "HF_DATASETS_CACHE": str(home / "datasets")}.items():
        monkeypatch.setenv(name, value)
    config = datasets.config
    monkeypatch.setattr(config, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(config, "HF_DATASETS_OFFLINE", True)
    monkeypatch.setattr(config, "HF_CACHE_HOME", str(home))
    monkeypatch.setattr(config, "HF_DATASETS_CACHE", home / "datasets")
    monkeypatch.setattr(config, "HF_MODULES_CACHE", home / "modules")
    monkeypatch.setattr(config, "DOWNLOADED_DATASETS_PATH", home / "datasets" / "downloads")
    monkeypatch.setattr(config, "EXTRACTED_DATASETS_PATH",
                        home / "datasets" / "downloads" / "extracted")
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HOME", str(home))
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))
    datasets.disable_progress_bars()
    return home


def _digit_images(count: int = 40) -> tuple[list[Image.Image], list[int]]:
    """`count` real digits upsampled to 24x24 RGB; pixel (0, 0) holds the index (unique)."""
    digits = load_digits("train")
    images = []
    for index in range(count):
        gray = digits.images[index, 0].numpy()
        rgb = np.repeat(np.kron(gray, np.ones((3, 3), np.uint8))[..., None], 3, axis=2)
        rgb[0, 0, 0] = index
        images.append(Image.fromarray(rgb, mode="RGB"))
    return images, [int(label) for label in digits.labels[:count]]


def _png(image: Image.Image) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format="PNG")
    return buffer.getvalue()


def _dataset(images: list[Image.Image], labels: list[int]) -> Dataset:
    features = Features({"image": HFImage(), "label": ClassLabel(names=NAMES)})
    return Dataset.from_dict({"image": [{"bytes": _png(im), "path": None} for im in images],
                              "label": labels}, features=features)


def _dataset_dict(count: int = 40) -> tuple[DatasetDict, list[Image.Image], list[int]]:
    images, labels = _digit_images(count)
    whole = _dataset(images, labels)
    return DatasetDict(train=whole.select(range(30)), validation=whole.select(range(30, 36)),
                       test=whole.select(range(36, count))), images, labels


def _write_parquet(parts: DatasetDict, folder: Path) -> Path:
    (folder / "data").mkdir(parents=True)
    for split, part in parts.items():
        part.to_parquet(str(folder / "data" / f"{split}-00000-of-00001.parquet"))
    return folder


def _assert_reads_like(records: ImageRecords, images: list[Image.Image], labels: list[int],
                       start: int) -> None:
    assert records.labels.dtype == np.int64
    assert records.labels.tolist() == labels[start:start + len(records)]
    for index in range(len(records)):
        decoded = records.read(index, 3)
        assert decoded.ok, decoded.reason
        np.testing.assert_array_equal(np.asarray(decoded.image),
                                      np.asarray(images[start + index]))  # PNG: exact


def test_save_to_disk_dataset_dict_gives_classes_labels_splits_and_exact_pixels(
        tmp_path: Path) -> None:
    parts, images, labels = _dataset_dict()
    parts.save_to_disk(str(tmp_path / "saved"))
    spec = str(tmp_path / "saved")
    train, held_out = load_hf_splits(spec)
    assert isinstance(train, ImageRecords) and isinstance(held_out, ImageRecords)
    assert train.classes == NAMES and held_out.classes == NAMES
    assert (len(train), len(held_out)) == (30, 6)  # evaluation: "validation" before "test"
    _assert_reads_like(train, images, labels, 0)
    _assert_reads_like(held_out, images, labels, 30)
    assert train.where(17) == f"hf:{spec} train[17]"
    assert train.read(0, 1).image.mode == "L"
    _, test = load_hf_splits(spec, eval_split="test")
    _assert_reads_like(test, images, labels, 36)
    assert len(load_hf_split(spec)) == 6 and len(load_hf_split(spec, "test")) == 4


def test_labels_come_without_decoding_images(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    parts, _, labels = _dataset_dict()
    parts.save_to_disk(str(tmp_path / "saved"))
    train, _ = load_hf_splits(str(tmp_path / "saved"))

    def no_decoding(*args: object, **kwargs: object) -> None:
        raise AssertionError("labels decoded an image")

    monkeypatch.setattr(hf_source, "decode_image", no_decoding)
    assert train.labels.tolist() == labels[:30]


def test_missing_split_names_the_splits_found_and_the_named_one_works(tmp_path: Path) -> None:
    parts, _, _ = _dataset_dict()
    parts.save_to_disk(str(tmp_path / "saved"))
    with pytest.raises(DataError) as caught:
        load_hf_splits(str(tmp_path / "saved"), eval_split="dev")
    says(str(caught.value), "dev", "train, validation, test", "split=")
    with pytest.raises(DataError) as caught:
        load_hf_splits(str(tmp_path / "saved"), train_split="training")
    says(str(caught.value), "training", "train_split=")
    train, held_out = load_hf_splits(str(tmp_path / "saved"), train_split="validation",
                                     eval_split="test")
    assert (len(train), len(held_out)) == (6, 4)


def _follow_hold_out_advice(message: str) -> str:
    """Run the command a one-split message gives; the data=hf:FOLDER it says to pass then."""
    command = re.search(r'python -c "(.+?)"', message)
    folder = re.search(r"pass data=hf:(\S+)", message)
    assert command and folder, message
    exec(command.group(1), {})  # the advice's Python, as `python -c` runs it
    return folder.group(1)


@pytest.mark.parametrize("saved", ["dataset_dict", "dataset"])
def test_only_a_train_split_is_told_to_hold_out_validation_and_that_trains(
        tmp_path: Path, saved: str) -> None:
    images, labels = _digit_images()
    whole = _dataset(images, labels)
    if saved == "dataset":  # a lone Dataset (state.json), read as the train split
        whole.save_to_disk(str(tmp_path / "one"))
    else:
        DatasetDict(train=whole).save_to_disk(str(tmp_path / "one"))
    with pytest.raises(DataError) as caught:
        load_hf_splits(str(tmp_path / "one"))
    message = str(caught.value)
    says(message, "only a 'train' split", "no held-out split", "train_test_split(test_size=0.1",
         "save_to_disk")
    assert "split=NAME" not in message  # a set of one split has no other to name
    folder = _follow_hold_out_advice(message)
    train, held_out = load_hf_splits(folder)
    assert (len(train), len(held_out), held_out.name) == (36, 4, f"hf:{folder} validation")
    assert train.classes == held_out.classes == NAMES


def test_the_hold_out_advice_is_followed_from_the_command_line(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    from vitkit.cli import main

    images, labels = _digit_images()
    DatasetDict(train=_dataset(images, labels)).save_to_disk(str(tmp_path / "one"))
    run = ["--out", str(tmp_path / "run"), 'model={"img_size": 24, "patch_size": 8, '
           '"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32}', "epochs=1",
           "batch_size=10", "warmup_epochs=0", "progress=false"]
    assert main(["train", f"data=hf:{tmp_path / 'one'}", *run]) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err
    folder = _follow_hold_out_advice(err)
    assert main(["train", f"data=hf:{folder}", *run]) == 0
    assert (tmp_path / "run" / "last.pt").exists()


def test_parquet_folder_and_glob_take_splits_from_file_names(tmp_path: Path) -> None:
    parts, images, labels = _dataset_dict()
    folder = _write_parquet(parts, tmp_path / "pq")
    for spec in (str(folder), str(folder / "data" / "*.parquet")):
        train, held_out = load_hf_splits(spec)
        assert train.classes == NAMES
        _assert_reads_like(train, images, labels, 0)
        _assert_reads_like(held_out, images, labels, 30)  # validation, found by file name
    one_file = load_hf_split(str(folder / "data" / "test-00000-of-00001.parquet"), "test")
    _assert_reads_like(one_file, images, labels, 36)


def test_image_folder_with_train_and_test_class_folders(tmp_path: Path) -> None:
    images, labels = _digit_images()
    by_pixels = {}
    for index, (image, label) in enumerate(zip(images, labels, strict=True)):
        split = "train" if index < 30 else "test"
        folder = tmp_path / "folder" / split / NAMES[label]
        folder.mkdir(parents=True, exist_ok=True)
        image.save(folder / f"{index}.png")
        by_pixels[np.asarray(image).tobytes()] = label
    train, held_out = load_hf_splits(str(tmp_path / "folder"))
    present = sorted({NAMES[label] for label in labels[:30]})
    assert train.classes == present  # ClassLabel from the class folder names, sorted
    assert (len(train), len(held_out)) == (30, 10)
    for records in (train, held_out):
        for index in range(len(records)):
            decoded = records.read(index, 3)
            label = by_pixels[np.asarray(decoded.image).tobytes()]  # pixels exact
            assert records.classes[records.labels[index]] == NAMES[label]


def _populate_datasets_cache(parquet: Path, repo_id: str, home: Path) -> None:
    """What an online `load_dataset(repo_id)` leaves behind: the prepared arrow files in
    HF_DATASETS_CACHE/<org>___<name>/default/0.0.0/<commit>/ (the only cache datasets 5.2
    reads offline)."""
    org, name = repo_id.split("/")
    files = {split: str(parquet / "data" / f"{split}-00000-of-00001.parquet")
             for split in ("train", "validation", "test")}
    builder = Parquet(dataset_name=name, cache_dir=str(home / "staging"), data_files=files)
    builder.download_and_prepare()
    shutil.copytree(builder.cache_dir,
                    home / "datasets" / f"{org}___{name}" / "default" / "0.0.0" / "0123abcd")


def test_hub_name_offline_from_the_cache_then_missing_cache_advice_works(
        tmp_path: Path, offline_hf_home: Path) -> None:
    parts, images, labels = _dataset_dict()
    parquet = _write_parquet(parts, tmp_path / "pq")
    _populate_datasets_cache(parquet, "someorg/tiny", offline_hf_home)
    train, held_out = load_hf_splits("someorg/tiny")
    assert train.classes == NAMES and train.where(3) == "hf:someorg/tiny train[3]"
    _assert_reads_like(train, images, labels, 0)
    _assert_reads_like(held_out, images, labels, 30)

    with pytest.raises(DataError) as caught:
        load_hf_splits("someorg/absent")
    message = str(caught.value)
    assert "HF_DATASETS_OFFLINE=1 and HF_HUB_OFFLINE=1" in message
    assert str(offline_hf_home / "datasets") in message  # where the files go
    assert "hf download someorg/absent --repo-type dataset --local-dir DIR" in message
    assert "pass data=hf:DIR" in message
    train, _ = load_hf_splits(str(parquet))  # the advice: pass the downloaded folder
    _assert_reads_like(train, images, labels, 0)


def test_unknown_hub_name_says_how_to_find_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Hub name that does not exist (the online error, simulated) is a DataError naming it,
    with a search link and hf auth login."""
    def missing(*args: object, **kwargs: object) -> None:
        raise datasets.exceptions.DatasetNotFoundError(
            "Dataset 'someorg/nope' doesn't exist on the Hub or cannot be accessed.")

    monkeypatch.setattr(datasets, "load_dataset", missing)
    with pytest.raises(DataError) as caught:
        load_hf_splits("someorg/nope")
    says(str(caught.value), "'someorg/nope'", "Hugging Face Hub", "datasets?search=nope",
         "hf auth login")


def test_missing_local_path_is_named() -> None:
    with pytest.raises(DataError) as caught:
        load_hf_splits("./not/here")
    says(str(caught.value), "not/here", "no such file or folder", "save_to_disk folder")


def test_no_label_column_names_columns_and_types_and_class_encode_fix_works(
        tmp_path: Path) -> None:
    images, labels = _digit_images()
    rows = {"image": [{"bytes": _png(im), "path": None} for im in images],
            "label": [NAMES[label] for label in labels]}
    ds = Dataset.from_dict(rows, features=Features({"image": HFImage(), "label": Value("string")}))
    ds.save_to_disk(str(tmp_path / "strings"))
    with pytest.raises(DataError) as caught:
        load_hf_splits(str(tmp_path / "strings"), eval_split="train")
    message = str(caught.value)
    assert "its columns are image (Image), label (string)" in message
    assert "ds.class_encode_column(NAME)" in message
    ds.class_encode_column("label").save_to_disk(str(tmp_path / "encoded"))  # the advice
    train, _ = load_hf_splits(str(tmp_path / "encoded"), eval_split="train")
    assert train.classes == sorted(set(rows["label"]))
    assert [train.classes[k] for k in train.labels] == rows["label"]


def test_no_image_column_is_refused_naming_columns(tmp_path: Path) -> None:
    features = Features({"pixels": datasets.Sequence(Value("uint8")),
                         "label": ClassLabel(names=NAMES)})
    Dataset.from_dict({"pixels": [[0, 1], [2, 3]], "label": [0, 1]}, features=features
                      ).save_to_disk(str(tmp_path / "arrays"))
    with pytest.raises(DataError) as caught:
        load_hf_splits(str(tmp_path / "arrays"), eval_split="train")
    says(str(caught.value), "no Image column", "pixels (", "label (ClassLabel(10 names))",
         "datasets.Image")


def test_integer_target_column_gets_numbered_classes(tmp_path: Path,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    images, labels = _digit_images()
    features = Features({"image": HFImage(), "target": Value("int64")})
    Dataset.from_dict({"image": [{"bytes": _png(im), "path": None} for im in images],
                       "target": labels}, features=features).save_to_disk(str(tmp_path / "t"))
    with caplog.at_level(logging.INFO, logger="vitkit.data"):
        train, _ = load_hf_splits(str(tmp_path / "t"), eval_split="train")
    assert train.classes == [str(k) for k in range(max(labels) + 1)]
    assert train.labels.tolist() == labels
    assert "not a ClassLabel" in caplog.text


def test_unlabelled_split_is_refused_and_a_labelled_one_works(tmp_path: Path) -> None:
    images, labels = _digit_images()
    parts = DatasetDict(train=_dataset(images[:30], labels[:30]),
                        test=_dataset(images[30:], [-1] * 10),
                        valid=_dataset(images[30:], labels[30:]))
    parts.save_to_disk(str(tmp_path / "kaggle"))
    with pytest.raises(DataError) as caught:
        load_hf_splits(str(tmp_path / "kaggle"), eval_split="test")
    says(str(caught.value), "10 of 10 records", "no valid label", "train_split=", "split=",
         "train, test, valid")
    _, held_out = load_hf_splits(str(tmp_path / "kaggle"))  # "valid" comes before "test"
    assert held_out.labels.tolist() == labels[30:]


def test_corrupt_images_inside_a_dataset_are_refused_the_others_read(tmp_path: Path) -> None:
    images, labels = _digit_images(6)
    stored = [_png(im) for im in images]
    stored[2] = stored[2][: len(stored[2]) // 2]  # cut short
    stored[4] = stored[4][:60] + bytes(200)  # damaged after the header
    features = Features({"image": HFImage(), "label": ClassLabel(names=NAMES)})
    Dataset.from_dict({"image": [{"bytes": b, "path": None} for b in stored], "label": labels},
                      features=features).save_to_disk(str(tmp_path / "bad"))
    train, _ = load_hf_splits(str(tmp_path / "bad"), eval_split="train")
    for index in range(6):
        decoded = train.read(index, 3)
        if index in (2, 4):
            assert not decoded.ok and decoded.kind in ("corrupt", "truncated"), decoded.reason
            assert decoded.fix
        else:
            np.testing.assert_array_equal(np.asarray(decoded.image), np.asarray(images[index]))


def _stream_sources(tmp_path: Path) -> dict[str, str]:
    parts, _, _ = _dataset_dict()
    parts.save_to_disk(str(tmp_path / "saved"))
    return {"save_to_disk": str(tmp_path / "saved"),
            "parquet": str(_write_parquet(parts, tmp_path / "pq"))}


def _ids(stream: IterableRecords, **kwargs: int) -> list[int]:
    """The records read, by the index stored in pixel (0, 0) of each image."""
    return [int(np.asarray(image.image)[0, 0, 0]) for image, _, _ in stream.iterate(**kwargs)]


@pytest.mark.parametrize("source", ["save_to_disk", "parquet"])
def test_streaming_shards_cover_every_record_once_and_resume_exactly(
        tmp_path: Path, source: str) -> None:
    spec = _stream_sources(tmp_path)[source]
    train, held_out = load_hf_splits(spec, streaming=True)
    assert isinstance(train, IterableRecords) and not isinstance(train, ImageRecords)
    assert train.classes == NAMES
    # a save_to_disk set knows its size; a streamed parquet folder states none (datasets 5.2)
    sizes = (30, 6) if source == "save_to_disk" else (None, None)
    assert (train.num_records, held_out.num_records) == sizes
    for world_size in (1, 2, 3):
        shares = [_ids(train, epoch=0, seed=5, rank=rank, world_size=world_size, channels=3)
                  for rank in range(world_size)]
        assert sorted(i for share in shares for i in share) == list(range(30)), world_size
    whole = _ids(train, epoch=1, seed=5, rank=1, world_size=2, channels=3)
    assert _ids(train, epoch=1, seed=5, rank=1, world_size=2, channels=3, skip=4) == whole[4:]
    first = _ids(train, epoch=0, seed=5, rank=0, world_size=1, channels=3)
    assert first == _ids(train, epoch=0, seed=5, rank=0, world_size=1, channels=3)
    assert first != _ids(train, epoch=1, seed=5, rank=0, world_size=1, channels=3)
    assert first != _ids(train, epoch=0, seed=6, rank=0, world_size=1, channels=3)
    image, label, where = next(train.iterate(epoch=0, seed=5, rank=0, world_size=1, channels=3))
    _, labels = _digit_images()
    assert label == labels[int(np.asarray(image.image)[0, 0, 0])]
    assert where.startswith(f"hf:{spec} train (epoch 0, rank 0 of 1, record 0")


def test_eval_split_advice_and_probe_features_of_a_dataset_saved_again(
        tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """A split `vitkit eval` cannot find is refused advising its --split flag, which then
    evaluates; probe reads the features of a dataset saved anew at the same path, not a
    cached copy of the old one."""
    from vitkit.cli import main

    parts, _, _ = _dataset_dict()
    saved = tmp_path / "saved"
    parts.save_to_disk(str(saved))
    run = tmp_path / "run"
    assert main(["train", f"data=hf:{saved}", 'model={"img_size": 24, "patch_size": 8, '
                 '"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32}', "epochs=1",
                 "batch_size=10", "warmup_epochs=0", "progress=false", "--out", str(run)]) == 0
    capsys.readouterr()
    assert main(["eval", str(run), "--split", "dev"]) == 2
    err = capsys.readouterr().err
    says(err, "train, validation, test", "split=", "--split NAME")
    assert "Traceback" not in err
    assert main(["eval", str(run), "--split", "test", "--json"]) == 0  # the advice followed
    assert json.loads(capsys.readouterr().out)["images"] == 4  # the split named test
    assert main(["eval", str(run), "--json"]) == 0  # the held-out split the run evaluated on
    assert json.loads(capsys.readouterr().out)["split"] == "validation"
    reports = {path.name: json.loads(path.read_text())["images"]
               for path in run.glob("eval-hf_*.json")}
    assert sorted(reports.values()) == [4, 6] and all(  # a report each, by the split's name
        name.endswith(("-test.json", "-validation.json")) for name in reports)
    assert main(["probe", str(run), "--json", str(tmp_path / "first.json")]) == 0
    first = json.loads((tmp_path / "first.json").read_text())
    grown = DatasetDict(train=parts["train"], validation=concatenate_datasets(
        [parts["validation"]] * 3), test=parts["test"])
    grown.save_to_disk(str(tmp_path / "grown"))
    shutil.rmtree(saved)
    (tmp_path / "grown").rename(saved)
    assert main(["probe", str(run), "--json", str(tmp_path / "again.json")]) == 0
    again = json.loads((tmp_path / "again.json").read_text())
    assert (first["test_images"], again["test_images"]) == (6, 18)
