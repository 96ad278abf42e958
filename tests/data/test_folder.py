"""Class-per-folder image loading: formats, sizes, grayscale, unreadable files, errors (a
folder of one class is refused: a classifier needs two or more)."""

from __future__ import annotations

import io
import logging
import struct
import zlib
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.cli import main
from vitkit.data.dataset import DataError
from vitkit.data.image_decoder import decode_image
from vitkit.data.skipped import count_by_kind, read_skipped_files, write_skipped_files
from vitkit.data.sources import open_source
from vitkit.data.sources.folder import load_image_folder


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def _pixels(h: int, w: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, size=(h, w, 3), dtype=np.uint8)


def _save(path: Path, arr: np.ndarray, fmt: str | None = None) -> np.ndarray:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(arr).save(path, format=fmt)
    return arr


def _jpeg_bytes(h: int, w: int, seed: int) -> bytes:
    buf = io.BytesIO()
    Image.fromarray(_pixels(h, w, seed)).save(buf, format="JPEG", quality=90)
    return buf.getvalue()


@pytest.fixture
def simple(tmp_path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """cat: 3 PNGs, dog: 2 JPEGs, all 16x12 (HxW), plus files that must be ignored."""
    root = tmp_path / "pets"
    arrays = {}
    for i in range(3):
        arrays[f"cat/{i}.png"] = _save(root / f"cat/{i}.png", _pixels(16, 12, i))
    for i in range(2):
        arrays[f"dog/{i}.JPG"] = _save(root / f"dog/{i}.JPG", _pixels(16, 12, 10 + i), "JPEG")
    (root / "cat" / "notes.txt").write_text("not an image")
    (root / "cat" / ".hidden.png").write_bytes(b"junk")
    (root / "README.md").write_text("top-level files are not classes")
    return root, arrays


def test_png_and_jpeg_one_size(simple: tuple[Path, dict[str, np.ndarray]]) -> None:
    root, arrays = simple
    ds = load_image_folder(root, workers=0)
    assert ds.classes == ["cat", "dog"]
    assert ds.images.shape == (5, 3, 16, 12)
    assert ds.images.dtype == torch.uint8
    assert ds.labels.tolist() == [0, 0, 0, 1, 1]
    assert ds.skipped == 0 and ds.notes == []
    assert ds.name == "pets"
    # PNG is lossless: exact pixels, in HWC -> CHW order.
    assert np.array_equal(ds.images[1].permute(1, 2, 0).numpy(), arrays["cat/1.png"])
    # JPEG: what Pillow decodes.
    with Image.open(root / "dog/0.JPG") as img:
        assert np.array_equal(ds.images[3].permute(1, 2, 0).numpy(), np.asarray(img))


def test_process_pool_matches_in_process(simple: tuple[Path, dict[str, np.ndarray]]) -> None:
    root, _ = simple
    a = load_image_folder(root, workers=0)
    b = load_image_folder(root, workers=2)
    assert torch.equal(a.images, b.images) and torch.equal(a.labels, b.labels)


def test_mixed_sizes_resized(tmp_path: Path) -> None:
    big = _save(tmp_path / "a/big.png", _pixels(20, 30, 1))
    _save(tmp_path / "a/small.png", _pixels(8, 8, 2))
    _save(tmp_path / "b/exact.png", _pixels(8, 12, 3))
    ds = load_image_folder(tmp_path, image_size=(8, 12), workers=0)
    assert ds.images.shape == (3, 3, 8, 12)
    expected = np.asarray(Image.fromarray(big).resize((12, 8), Image.Resampling.BILINEAR))
    assert np.array_equal(ds.images[0].permute(1, 2, 0).numpy(), expected)
    assert load_image_folder(tmp_path, image_size=10, workers=0).images.shape == (3, 3, 10, 10)


def test_wrong_size_without_resize(tmp_path: Path) -> None:
    _save(tmp_path / "a/ok.png", _pixels(8, 8, 1))
    _save(tmp_path / "a/wide.png", _pixels(8, 20, 2))
    for workers in (0, 2):
        with pytest.raises(DataError) as caught:
            load_image_folder(tmp_path, image_size=8, resize=False, workers=workers)
        says(str(caught.value), "a/wide.png", "8x20", "image_size", "8x8", "resize=True")
    assert load_image_folder(tmp_path, image_size=8, resize=True,  # the advice
                             workers=0).images.shape == (2, 3, 8, 8)


def test_mixed_sizes_without_image_size(tmp_path: Path) -> None:
    for i in range(3):
        _save(tmp_path / f"a/{i}.png", _pixels(8, 8, i))
    _save(tmp_path / "b/odd.png", _pixels(5, 7, 9))
    with pytest.raises(DataError) as caught:
        load_image_folder(tmp_path, workers=0)
    says(str(caught.value), "2 different sizes", "8x8 (3 files", "5x7 (1 files", "b/odd.png",
         "image_size=")
    assert load_image_folder(tmp_path, image_size=8,  # the advice
                             workers=0).images.shape == (4, 3, 8, 8)


def test_corrupt_and_truncated_files_are_skipped(
    simple: tuple[Path, dict[str, np.ndarray]], caplog: pytest.LogCaptureFixture
) -> None:
    root, _ = simple
    (root / "cat" / "bad.jpg").write_bytes(np.random.default_rng(0).bytes(500))
    full = _jpeg_bytes(64, 64, 5)
    (root / "dog" / "cut.jpg").write_bytes(full[: len(full) // 2])
    with caplog.at_level(logging.WARNING, logger="vitkit.data"):
        ds = load_image_folder(root, image_size=16, workers=0)
    assert len(ds) == 5
    assert ds.skipped == 2
    assert ds.labels.tolist() == [0, 0, 0, 1, 1]
    assert len(ds.notes) == 1
    note = ds.notes[0]
    says(note, "skipped 2 of 7 files", "1 not an image", "1 truncated", "cat/bad.jpg",
         "no image format recognised", "dog/cut.jpg", "image file is truncated")
    assert str(root) not in note  # reasons are short: no full paths
    assert any("skipped 2 of 7 files" in r.getMessage() for r in caplog.records)
    assert [(Path(p).relative_to(root).as_posix(), r.partition(":")[0])
            for p, r in ds.skipped_files] == [("cat/bad.jpg", "not an image"),
                                              ("dog/cut.jpg", "truncated")]


def test_all_unreadable(tmp_path: Path) -> None:
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "x.png").write_bytes(b"\x89PNG garbage")
    with pytest.raises(DataError) as caught:
        load_image_folder(tmp_path, workers=0)
    says(str(caught.value), "no readable images", "all 1 files", "skipped", "a/x.png")


def test_one_channel(tmp_path: Path) -> None:
    rgb = _save(tmp_path / "a/0.png", _pixels(6, 6, 0))
    gray = np.random.default_rng(1).integers(0, 256, size=(6, 6), dtype=np.uint8)
    Image.fromarray(gray, mode="L").save(tmp_path / "a/1.png")
    ds = load_image_folder(tmp_path, channels=1, workers=0)
    assert ds.images.shape == (2, 1, 6, 6)
    assert ds.channels == 1
    assert np.array_equal(ds.images[0, 0].numpy(), np.asarray(Image.fromarray(rgb).convert("L")))
    assert np.array_equal(ds.images[1, 0].numpy(), gray)
    # And grayscale files become 3 equal channels when loaded as RGB.
    ds3 = load_image_folder(tmp_path, channels=3, workers=0)
    assert torch.equal(ds3.images[1, 0], ds3.images[1, 2])


def test_folder_errors(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with pytest.raises(DataError, match=r"does not exist.*<class_name>"):
        load_image_folder(tmp_path / "missing")
    with pytest.raises(DataError, match="no class folders"):
        load_image_folder(tmp_path)
    _save(tmp_path / "loose.png", _pixels(4, 4, 0))
    with pytest.raises(DataError) as caught:
        load_image_folder(tmp_path)
    says(str(caught.value), "1 images", "directly", "one sub-folder per class")
    (tmp_path / "cat").mkdir()
    (tmp_path / "cat" / "readme.txt").write_text("no images here")
    with pytest.raises(DataError, match=r"no images in any class folder"):
        load_image_folder(tmp_path / "cat/..")  # only "cat", which is empty, so far
    _save(tmp_path / "dog/0.png", _pixels(4, 4, 0))
    with caplog.at_level(logging.WARNING, logger="vitkit.data"):
        loaded = load_image_folder(tmp_path)  # the empty class is warned about and left out
    assert loaded.classes == ["dog"] and len(loaded) == 1
    says(caplog.text, "class folder(s)", "no images", "left out", "cat")
    with pytest.raises(DataError, match="channels must be 1"):
        load_image_folder(tmp_path, channels=4)
    with pytest.raises(DataError, match="image_size must be"):
        load_image_folder(tmp_path, image_size=(0, 4))


def test_auto_workers_on_a_larger_folder(tmp_path: Path) -> None:
    for i in range(80):
        _save(tmp_path / f"c{i % 3}/{i:03d}.png", _pixels(4, 4, i))
    auto = load_image_folder(tmp_path)  # enough files for the process pool (given >1 core)
    serial = load_image_folder(tmp_path, workers=0)
    assert auto.images.shape == (80, 3, 4, 4)
    assert torch.equal(auto.images, serial.images) and torch.equal(auto.labels, serial.labels)


# -- every skipped file named, and written beside a run --------------------------------------

def _bomb_header() -> bytes:
    """A PNG header claiming 100000x100000 pixels (no pixel data): a decompression bomb."""
    header = struct.pack(">IIBBBBB", 100_000, 100_000, 8, 2, 0, 0, 0)
    ihdr = b"IHDR" + header
    return (b"\x89PNG\r\n\x1a\n" + struct.pack(">I", len(header)) + ihdr
            + struct.pack(">I", zlib.crc32(ihdr)) + b"\x00\x00\x00\x00IEND\xaeB`\x82")


def test_every_skipped_file_named_written_and_fixed(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    root = tmp_path / "pets"
    for split, count in (("train", 3), ("val", 1)):
        for name in ("cat", "dog"):
            for i in range(count):
                _save(root / split / name / f"{i}.png", _pixels(8, 8, i))
    bad = {
        "train/cat/empty.png": (b"", "empty file"),
        "train/cat/notes.png": (b"just some text\n", "not an image"),
        "train/cat/cut.jpg": (_jpeg_bytes(32, 32, 1)[:300], "truncated"),
        "train/dog/bomb.png": (_bomb_header(), "too many pixels"),
        "train/dog/noise.jpg": (np.random.default_rng(0).bytes(400), "not an image"),
        "val/dog/cut.jpg": (_jpeg_bytes(32, 32, 2)[:300], "truncated"),
    }
    for rel, (data, _) in bad.items():
        (root / rel).write_bytes(data)

    with caplog.at_level(logging.WARNING, logger="vitkit.data"):
        train, test = open_source("folder", str(root), image_size=(8, 8), mode="memory")
    assert len(train) == 6 and len(test) == 2 and train.skipped == 5 and test.skipped == 1
    listed = train.skipped_files + test.skipped_files
    assert {Path(p).relative_to(root).as_posix(): r.partition(":")[0] for p, r in listed} == {
        rel: kind for rel, (_, kind) in bad.items()}
    assert count_by_kind(train.skipped_files) == {"not an image": 2, "empty file": 1,
                                                  "truncated": 1, "too many pixels": 1}
    summary = [r.getMessage() for r in caplog.records if "skipped 5 of 11 files" in r.getMessage()]
    assert len(summary) == 1
    says(summary[0], "2 not an image", "1 empty file", "1 too many pixels", "1 truncated")

    written = write_skipped_files(tmp_path / "run", train, test)
    assert written == tmp_path / "run" / "skipped_files.txt"
    assert read_skipped_files(written) == listed  # every file, in load order
    text = written.read_text()
    assert text.startswith("# 6 unreadable files skipped (path<TAB>reason); by kind:\n")
    assert "#   2 truncated: the file was cut short" in text

    for path, _ in listed:  # the advice for each: fetch a good copy of the file
        _save(Path(path), _pixels(8, 8, 5), "PNG")
    train, test = open_source("folder", str(root), image_size=(8, 8), mode="memory")
    assert (len(train), len(test), train.skipped_files, test.skipped_files) == (11, 3, [], [])
    assert write_skipped_files(tmp_path / "run2", train, test) is None
    assert not (tmp_path / "run2").exists()


def test_skips_named_by_pool_workers_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Worker processes refuse the same files for the same reasons, with the caller's
    decompression-bomb limit."""
    for i in range(4):
        _save(tmp_path / f"c{i % 2}/{i}.png", _pixels(4, 4, i))
    _save(tmp_path / "c0/big.png", _pixels(8, 8, 9))
    (tmp_path / "c1/empty.jpg").write_bytes(b"")
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", 20)  # 4x4 fits, 8x8 does not
    serial = load_image_folder(tmp_path, image_size=4, workers=0)
    pooled = load_image_folder(tmp_path, image_size=4, workers=2)
    assert serial.skipped_files == pooled.skipped_files
    assert [(Path(p).name, r.partition(":")[0]) for p, r in pooled.skipped_files] == [
        ("big.png", "too many pixels"), ("empty.jpg", "empty file")]
    says(pooled.skipped_files[0][1], "64 pixels", "decompression-bomb limit of 20")
    says(pooled.skipped_files[1][1], "0 bytes")
    assert torch.equal(serial.images, pooled.images) and len(pooled) == 4


def test_folder_converts_like_the_decoder(tmp_path: Path) -> None:
    """16-bit, transparent and EXIF-rotated files: the folder's pixels are the decoder's."""
    for folder in ("a", "b"):
        (tmp_path / folder).mkdir()
    Image.fromarray(np.full((6, 6), 40000, dtype=np.uint16)).save(tmp_path / "a/g16.png")
    Image.fromarray(_pixels(6, 6, 7).repeat(2, axis=2)[..., :4], mode="RGBA").save(
        tmp_path / "a/rgba.png")
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(_pixels(6, 6, 8)).save(tmp_path / "b/rotated.png", exif=exif)
    ds = load_image_folder(tmp_path, workers=0)
    for index, rel in enumerate(["a/g16.png", "a/rgba.png", "b/rotated.png"]):
        expected = np.asarray(decode_image(tmp_path / rel).image)
        assert np.array_equal(ds.images[index].permute(1, 2, 0).numpy(), expected), rel
    assert (ds.images[0] == 40000 >> 8).all()  # 156: scaled, not clipped to 255
    with Image.open(tmp_path / "b/rotated.png") as stored:
        assert np.array_equal(ds.images[2].permute(1, 2, 0).numpy(),
                              np.rot90(np.asarray(stored), k=-1))


TINY = ['model={"img_size": 16, "patch_size": 8, "width": 16, "depth": 1, "num_heads": 2, '
        '"mlp_dim": 32}', "epochs=1", "batch_size=4", "warmup_epochs=0", "progress=false"]


def _folder(root: Path, classes: list[str]) -> Path:
    for split in ("train", "val"):
        for k, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(4):
                Image.new("RGB", (16, 16), (60 * k + i, 20, 90)).save(
                    root / split / name / f"{i}.png")
    return root


def test_a_one_class_folder_is_refused_and_a_second_class_trains(tmp_path, capsys):
    data = _folder(tmp_path / "data", ["cat"])
    assert main(["train", "data=folder", f"data_dir={data}", *TINY, "--out",
                 str(tmp_path / "run")]) == 2
    err = capsys.readouterr().err
    says(err, str(data), "one class (cat)", "two or more", "one sub-folder per class", "train/",
         "val/")
    assert "Traceback" not in err
    _folder(data, ["cat", "dog"])  # the advice followed
    assert main(["train", "data=folder", f"data_dir={data}", *TINY, "--out",
                 str(tmp_path / "run")]) == 0


@pytest.mark.parametrize("split", ["train", "val"])
def test_a_split_folder_passed_for_the_data_folder_is_told_its_parent(tmp_path, capsys, split):
    """data_dir=ROOT/train (a class level) is told to pass ROOT, and ROOT trains."""
    data = _folder(tmp_path / "pets", ["cat", "dog"])
    run = ["--out", str(tmp_path / "run"), *TINY]
    assert main(["train", f"data_dir={data / split}", *run]) == 2
    err = capsys.readouterr().err
    says(err, f"{data / split} holds class folders (cat, dog)", f"pass data_dir={data} ",
         f"--data-dir {data}")
    assert "train/train" not in err and "Traceback" not in err
    assert main(["train", f"data_dir={data}", *run]) == 0  # the advice followed
    assert (tmp_path / "run" / "last.pt").exists()


def test_class_folders_without_splits_are_told_to_make_train_and_val(tmp_path, capsys):
    made = _folder(tmp_path / "made", ["cat", "dog"])
    flat = made / "train"  # ROOT/<class>/ with no train/ and val/ around it
    run = ["data=folder", f"data_dir={flat}", "--out", str(tmp_path / "run"), *TINY]
    (made / "val").rename(tmp_path / "held_out")
    assert main(["train", *run]) == 2
    says(capsys.readouterr().err, f"{flat} holds class folders (cat, dog)", f"{flat}/train/",
         f"{flat}/val/<class_name>/")
    for name in ("cat", "dog"):  # the advice followed
        (flat / "train").mkdir(exist_ok=True)
        (flat / name).rename(flat / "train" / name)
    (tmp_path / "held_out").rename(flat / "val")
    assert main(["train", *run]) == 0
