"""The two feed protocols (`vitkit.data.feeds`): training and evaluation batches of in-memory
and streamed data answer the same calls with the same shapes, labels and order, so no caller
asks which kind it got."""

from pathlib import Path

import numpy as np
import torch
from PIL import Image

from vitkit.data.feeds import eval_batches, evaluation_feed, record_count, training_feed
from vitkit.data.loader import BatchOrder
from vitkit.data.sources import open_source
from vitkit.data.transforms import InceptionCrop, evaluation_preprocess


def _folder(root: Path) -> Path:
    """root/train and root/val, 2 classes, 16x16 PNGs (lossless: memory and stream agree)."""
    rng = np.random.default_rng(0)
    for split, count in (("train", 5), ("val", 3)):
        for c in range(2):
            folder = root / split / f"class{c}"
            folder.mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, size=(16, 16, 3), dtype=np.uint8)
                Image.fromarray(pixels).save(folder / f"{i}.png")
    (root / "train" / "class1" / "broken.png").write_bytes(b"not a png")
    return root


def test_training_feeds_in_memory_and_streamed_answer_the_same_protocol(tmp_path: Path) -> None:
    root = _folder(tmp_path / "data")
    for mode, global_batches in (("memory", True), ("stream", False)):
        train, _ = open_source("folder", str(root), (16, 16), 3, mode=mode)
        assert train.streamed == (mode == "stream")
        order = BatchOrder(record_count(train), batch_size=4, seed=1, drop_last=False)
        feed = training_feed(train, order, InceptionCrop((16, 16)), 3, (16, 16), seed=1,
                             workers=0)
        batches = list(feed.epoch(0, start_batch=1))
        feed.close()
        assert feed.global_batches is global_batches
        assert [index for index, _, _ in batches] == list(range(1, order.batches_per_epoch()))
        for _, images, labels in batches:
            assert images.dtype == torch.uint8 and images.shape[1:] == (3, 16, 16)
            assert labels.dtype == torch.int64 and len(labels) == len(images)
        # the unreadable file is named either way: skipped when decoded into memory, or
        # left out of its batch when streamed (which may be batch 0: read the whole epoch)
        if mode == "stream":
            list(feed.epoch(0))
            feed.close()
        assert [Path(p).name for p, _ in feed.skipped_files] == ["broken.png"]


def test_evaluation_feeds_in_memory_and_streamed_give_the_same_batches(tmp_path: Path) -> None:
    root = _folder(tmp_path / "data")
    feeds = {}
    for mode in ("memory", "stream"):
        _, test = open_source("folder", str(root), (16, 16), 3, mode=mode)
        preprocess = evaluation_preprocess((16, 16), 3, streamed=False, crop_pct=1.0)
        feeds[mode] = evaluation_feed(test, preprocess, 3, workers=0)
    memory, stream = feeds["memory"], feeds["stream"]
    assert len(memory) == len(stream) == 6
    assert memory.classes == stream.classes == ["class0", "class1"]
    assert (memory.channels, memory.image_size) == (stream.channels, stream.image_size)
    assert torch.equal(memory.labels, stream.labels)
    for rank in (0, 1):  # each rank's share, in the same fixed order
        ours = list(eval_batches(memory, 2, rank, 2))
        theirs = list(eval_batches(stream, 2, rank, 2))
        assert len(ours) == len(theirs) == 2
        for (a, la), (b, lb) in zip(ours, theirs, strict=True):
            assert torch.equal(a, b) and torch.equal(la, lb)  # 16x16 PNGs: squash is exact
    assert memory.skipped_files == stream.skipped_files == []


def test_a_fresh_run_evaluates_streamed_images_by_their_shorter_side() -> None:
    streamed = evaluation_preprocess([32, 32], 1, streamed=True, crop_pct=0.875)
    held = evaluation_preprocess([32, 32], 1, streamed=False, crop_pct=0.875)
    assert (streamed.resize_mode, streamed.crop_pct, streamed.mean) == ("shorter_side", 0.875,
                                                                         (0.5,))
    assert (held.resize_mode, held.crop_pct, held.img_size) == ("squash", 1.0, (32, 32))
