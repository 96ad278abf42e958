"""Streamed image data: the Inception crop against torchvision's, the cached file index, the
automatic memory/stream choice, per-rank shards, exact mid-epoch resume, skipped files, the
folder errors and `vitkit train KEY=VALUE` with no recipe."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.data import sources
from vitkit.data.dataset import ImageDataset
from vitkit.data.feeds import StreamFeed
from vitkit.data.loader import BatchOrder
from vitkit.data.skipped import read_skipped_files
from vitkit.data.sources import open_source
from vitkit.data.sources.folder import FolderRecords
from vitkit.data.transforms import InceptionCrop
from vitkit.errors import ConfigError, DataError
from vitkit.train.config import load_train_config
from vitkit.train.loop import run_loop
from vitkit.train.setup import build_run


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def _jpeg_folder(root: Path, per_class: int = 12, classes: int = 3, seed: int = 0) -> Path:
    """root/train/<c>/*.jpg and root/val/<c>/*.jpg of different sizes (a colour per class)."""
    rng = np.random.default_rng(seed)
    for split, count in (("train", per_class), ("val", 4)):
        for c in range(classes):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True, exist_ok=True)
            for i in range(count):
                h, w = (int(v) for v in rng.integers(20, 48, size=2))
                pixels = rng.integers(0, 60, size=(h, w, 3)) + np.array([80 * c, 40, 200 - 80 * c])
                Image.fromarray(pixels.clip(0, 255).astype(np.uint8)).save(folder / f"{i}.jpg")
    return root


def test_inception_crop_draws_windows_as_torchvision_does() -> None:
    torchvision = pytest.importorskip("torchvision")
    rrc = torchvision.transforms.RandomResizedCrop(224)
    crop = InceptionCrop((224, 224))
    rng = np.random.default_rng(0)
    ours = np.array([crop.window(400, 300, rng) for _ in range(3000)], dtype=float)
    torch.manual_seed(0)
    image = Image.new("RGB", (400, 300))
    theirs = np.array([rrc.get_params(image, rrc.scale, rrc.ratio) for _ in range(3000)],
                      dtype=float)  # (top, left, h, w)
    our_area = ours[:, 2] * ours[:, 3] / 120_000
    their_area = theirs[:, 2] * theirs[:, 3] / 120_000
    # Same distribution of window areas and aspect ratios (3,000 draws each: +-0.02).
    assert abs(our_area.mean() - their_area.mean()) < 0.02
    assert abs(np.log(ours[:, 2] / ours[:, 3]).mean()
               - np.log(theirs[:, 3] / theirs[:, 2]).mean()) < 0.02
    assert our_area.min() >= 0.08 - 0.01 and our_area.max() <= 1.0
    # Where no window fits (a 1000x10 strip), both take the same centred fallback.
    fallback = crop.window(1000, 10, rng)
    top, left, h, w = rrc.get_params(Image.new("RGB", (1000, 10)), rrc.scale, rrc.ratio)
    assert fallback == (left, top, w, h)


def test_file_index_is_cached_and_rescanned_when_a_folder_changes(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = _jpeg_folder(tmp_path / "data")
    first = FolderRecords.scan(root / "train")
    assert len(first) == 36 and first.classes == ["class0", "class1", "class2"]
    assert first.where(0).endswith("class0/0.jpg") and first.labels.tolist()[-1] == 2

    def no_scan(*_args: object) -> None:
        raise AssertionError("the folder was listed again")

    monkeypatch.setattr(FolderRecords, "_scan", classmethod(no_scan))
    cached = FolderRecords.scan(root / "train")  # unchanged: read from the cache
    assert [cached.where(i) for i in range(36)] == [first.where(i) for i in range(36)]
    monkeypatch.undo()
    Image.new("RGB", (30, 30)).save(root / "train/class1/new.jpg")
    rescanned = FolderRecords.scan(root / "train")  # class1/ changed: listed again
    assert len(rescanned) == 37


def test_auto_mode_streams_only_what_would_not_fit(tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    root = _jpeg_folder(tmp_path / "data")
    train, _ = open_source("folder", str(root), (16, 16), 3, mode="auto")
    assert isinstance(train, ImageDataset) and train.images.shape == (36, 3, 16, 16)
    monkeypatch.setattr(sources, "MEMORY_LIMIT_BYTES", 36 * 3 * 16 * 16)  # less than 48 images
    train, test = open_source("folder", str(root), (16, 16), 3, mode="auto")
    assert isinstance(train, FolderRecords) and len(train) == 36 and len(test) == 12
    train, _ = open_source("folder", str(root), (16, 16), 3, mode="memory")
    assert isinstance(train, ImageDataset)
    with pytest.raises(ConfigError) as caught:
        open_source("digits", mode="stream")
    says(str(caught.value), "data=digits", "memory", "data_mode=stream", "drop the setting")
    assert isinstance(open_source("digits")[0], ImageDataset)  # the advice: setting dropped


def test_rank_shards_together_are_the_single_process_batch(tmp_path: Path) -> None:
    records = FolderRecords.scan(_jpeg_folder(tmp_path / "data") / "train")
    order = BatchOrder(len(records), batch_size=10, seed=3)
    crop = InceptionCrop((16, 16))

    def first_batches(rank: int, world: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
        feed = StreamFeed(records, order, crop, 3, (16, 16), seed=3, rank=rank,
                          world_size=world, workers=1 if rank else 0)
        return [(images, labels) for _, images, labels in feed.epoch(1)]

    whole = first_batches(0, 1)
    halves = [first_batches(r, 2) for r in (0, 1)]
    assert len(whole) == 3
    for b, (images, labels) in enumerate(whole):
        assert torch.equal(torch.cat([halves[0][b][0], halves[1][b][0]]), images)
        assert torch.equal(torch.cat([halves[0][b][1], halves[1][b][1]]), labels)


def _stream_config(root: Path, out: Path, *extra: str):
    return load_train_config(None, [
        "data=folder", f"data_dir={json.dumps(str(root))}", "data_mode=stream", "workers=2",
        'model={"variant": "Ti/4", "img_size": 16, "width": 32, "depth": 2, "num_heads": 2, '
        '"mlp_dim": 64}', "epochs=2", "batch_size=8", "warmup_epochs=0", "progress=false",
        "augment.trivial_augment=true", f"out_dir={json.dumps(str(out))}", *extra])


def test_streamed_training_resumes_exactly_mid_epoch(tmp_path: Path) -> None:
    """With dropout and drop path on, a streamed run stopped mid-epoch and resumed ends with
    exactly the weights of the run that was not stopped."""
    root = _jpeg_folder(tmp_path / "data")
    (root / "train/class2/broken.jpg").write_bytes(b"\xff\xd8 not really a jpeg")
    noisy = ("model.dropout=0.1", "model.drop_path=0.1")
    straight = build_run(_stream_config(root, tmp_path / "a", *noisy))
    assert straight.data.streamed
    run_loop(straight)
    first = build_run(_stream_config(root, tmp_path / "b", *noisy))
    step = first.step

    def stop_mid_epoch(images, labels, lr, position):
        if first.position.step == 6:  # epoch 2 of 4 steps each: stop after its second step
            first.stop.reason = "SIGTERM"
        return step(images, labels, lr, position)

    first.step = stop_mid_epoch
    run_loop(first)
    assert (first.position.epoch, first.position.batch) == (1, 3)
    resumed = build_run(_stream_config(root, tmp_path / "b", *noisy),
                        resume=tmp_path / "b/last.pt")
    run_loop(resumed)
    for key, value in straight.model.state_dict().items():
        assert torch.equal(value, resumed.model.state_dict()[key]), key
    # The unreadable file was skipped and named, and training went on.
    skipped = read_skipped_files(tmp_path / "a/skipped_files.txt")
    assert [Path(p).name for p, _ in skipped] == ["broken.jpg"]
    assert skipped[0][1].startswith("corrupt")
    # Evaluation: shorter side to 16 / 0.875, centre crop, saved with the weights.
    pre = straight.checkpoint().trained.preprocess
    assert (pre.resize_mode, pre.crop_pct) == ("shorter_side", 0.875)


def test_folder_errors_name_the_problem_and_the_fix(tmp_path: Path) -> None:
    root = _jpeg_folder(tmp_path / "data")
    (root / "val").rename(root / "held")
    with pytest.raises(DataError) as caught:
        open_source("folder", str(root), (16, 16), mode="stream")
    says(str(caught.value), "no val/", "test/", "held, train", "val/<class_name>")
    (root / "held").rename(root / "val")  # as the message says: a val/ folder
    (root / "val/class1").rename(root / "val/other")
    with pytest.raises(DataError) as caught:
        open_source("folder", str(root), (16, 16), mode="stream")
    says(str(caught.value), "only in train/: class1", "only in val/: other")
    (root / "val/other").rename(root / "val/class1")
    (root / "train/empty").mkdir()  # an empty class folder: warned and left out
    train, test = open_source("folder", str(root), (16, 16), mode="stream")
    assert train.classes == test.classes == ["class0", "class1", "class2"]


def test_train_with_only_overrides_starts_from_the_defaults(tmp_path: Path) -> None:
    root = _jpeg_folder(tmp_path / "data")
    out = tmp_path / "run"
    done = subprocess.run(
        [sys.executable, "-m", "vitkit.cli", "train", "data=folder", f"data_dir={root}",
         "data_mode=stream", "model.img_size=32", "model.depth=1", "epochs=1", "batch_size=12",
         "warmup_epochs=0", "progress=false", "workers=0", f"out_dir={out}"],
        capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    saved = torch.load(out / "last.pt", weights_only=True)["train_config"]
    assert saved["model"] == {"variant": "Ti/16", "img_size": (32, 32), "depth": 1}
    assert saved["weight_decay"] == 0.05  # TrainConfig's default, not the digits recipe's 0.1
    assert (out / "metrics.csv").read_text().count("\n") == 2
