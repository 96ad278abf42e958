"""data=arrays: .npz files and .npy split folders, in memory or read batch by batch from the
files (`MappedArrays`), their feeds, per-channel statistics and the errors for bad input:
each names the problem and a fix that trains (a folder of arrays without data=arrays,
channels-last arrays and their transpose, target names that do not name one output each)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch

import vitkit
from vitkit.cli import main
from vitkit.data import sources
from vitkit.data.dataset import ImageDataset
from vitkit.data.feeds import evaluation_feed, training_feed
from vitkit.data.loader import BatchOrder, shard
from vitkit.data.sources import open_source
from vitkit.data.sources.mapped import MappedArrays
from vitkit.errors import ConfigError, DataError


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


def _fields(count: int, shape=(1, 6, 5), seed: int = 0, dtype=np.float32) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return (rng.normal(3.0, 2.0, size=(count, *shape)) * 10).astype(dtype)


def _write(root: Path, train: dict, test: dict, layout: str = "npz",
           compressed: bool = False) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    for split, arrays in (("train", train), ("test", test)):
        if layout == "npz":
            save = np.savez_compressed if compressed else np.savez
            save(root / f"{split}.npz", **arrays)
        else:
            (root / split).mkdir()
            for key, value in arrays.items():
                np.save(root / split / f"{key}.npy", value)
    return root


def _set(root: Path, layout: str = "npz", n: int = 40, shape=(2, 6, 5), dtype=np.float32,
         targets: np.ndarray | None = None, **extra) -> tuple[Path, np.ndarray, np.ndarray]:
    images = _fields(n + 10, shape, dtype=dtype)
    y = np.arange(n + 10) % 3 if targets is None else targets
    _write(root, {"images": images[:n], "targets": y[:n], **extra},
           {"images": images[n:], "targets": y[n:]}, layout)
    return root, images, y


@pytest.mark.parametrize("layout", ["npz", "npy"])
def test_memory_and_mapped_give_the_same_records_and_batches(tmp_path: Path, layout) -> None:
    root, images, y = _set(tmp_path / "d", layout, dtype=np.float16)
    memory, memory_test = open_source("arrays", str(root), mode="memory")
    mapped, mapped_test = open_source("arrays", str(root), mode="stream")
    assert isinstance(memory, ImageDataset) and isinstance(mapped, MappedArrays)
    assert isinstance(mapped_test, MappedArrays)
    assert not mapped.streamed and mapped.skipped_files == []
    expected = torch.from_numpy(images.astype(np.float32))
    assert torch.equal(memory.images, expected[:40])
    assert torch.equal(mapped.images(torch.arange(40)), expected[:40])
    for data in (memory, mapped):
        assert (len(data), data.channels, data.image_size) == (40, 2, (6, 5))
        assert data.labels.dtype == torch.int64 and data.labels.tolist() == y[:40].tolist()
    order = BatchOrder(40, batch_size=8, seed=5)
    feeds = [training_feed(data, order, None, 2, (6, 5), seed=5) for data in (memory, mapped)]
    assert all(feed.global_batches for feed in feeds)
    whole = [list(feed.epoch(2)) for feed in feeds]
    for (i, a, la), (j, b, lb) in zip(*whole, strict=True):
        assert i == j and torch.equal(a, b) and torch.equal(la, lb) and b.dtype == torch.float32
    # exact resume: batch 3 onwards equals the tail of the uninterrupted epoch, in BatchOrder
    resumed = list(feeds[1].epoch(2, start_batch=3))
    assert [r[0] for r in resumed] == [3, 4]
    for (_, a, la), (_, b, lb) in zip(whole[1][3:], resumed, strict=True):
        assert torch.equal(a, b) and torch.equal(la, lb)
    wanted = order.epoch_indices(2)[24:32]
    assert torch.equal(resumed[0][1], expected[wanted])
    # held-out: this rank's share in fixed order, as in memory
    for rank in (0, 1):
        got = [evaluation_feed(t, None, 2).eval_batches(4, rank, 2)
               for t in (memory_test, mapped_test)]
        a, b = (list(g) for g in got)
        share = shard(torch.arange(10), rank, 2)
        assert torch.equal(torch.cat([im for im, _ in b]), expected[40:][share])
        for x, z in zip(a, b, strict=True):
            assert torch.equal(x[0], z[0]) and torch.equal(x[1], z[1])


@pytest.mark.parametrize("dtype", [np.float64, np.float16, np.uint16, np.uint8, np.int32,
                                   np.bool_])
def test_any_numeric_dtype_arrives_as_float32_in_its_own_units(tmp_path: Path, dtype) -> None:
    raw = np.random.default_rng(1).integers(0, 60000 if dtype == np.uint16 else 2
                                            if dtype == np.bool_ else 250, size=(12, 4, 4))
    images = raw.astype(dtype)
    _write(tmp_path, {"images": images[:8], "targets": np.zeros(8, np.int64)},
           {"images": images[8:], "targets": np.zeros(4, np.int64)})
    for mode in ("memory", "stream"):
        train, _ = open_source("arrays", str(tmp_path), mode=mode)
        got = train.images if mode == "memory" else train.images(range(8))
        assert got.dtype == torch.float32 and got.shape == (8, 1, 4, 4)
        assert np.array_equal(got.numpy()[:, 0], images[:8].astype(np.float32))


def test_channels_last_is_read_when_unambiguous(tmp_path: Path) -> None:
    nchw = _fields(10, (3, 7, 5))
    _write(tmp_path, {"images": nchw.transpose(0, 2, 3, 1)[:6], "targets": np.arange(6) % 2},
           {"images": nchw.transpose(0, 2, 3, 1)[6:], "targets": np.arange(4) % 2})
    for mode in ("memory", "stream"):
        train, test = open_source("arrays", str(tmp_path), mode=mode)
        assert (train.channels, train.image_size) == (test.channels, test.image_size)
        assert (train.channels, train.image_size) == (3, (7, 5))
        got = train.images if mode == "memory" else train.images([0, 1, 2, 3, 4, 5])
        assert np.array_equal(got.numpy(), nchw[:6])


def test_float_targets_and_names_and_val_split(tmp_path: Path) -> None:
    images = _fields(9, (6, 5))
    y = np.random.default_rng(2).normal(size=(9, 2))
    np.savez(tmp_path / "train.npz", images=images[:6], targets=y[:6],
             target_names=np.array(["mass", "spin"]))
    np.savez(tmp_path / "val.npz", images=images[6:], targets=y[6:])
    train, val = open_source("arrays", str(tmp_path), mode="stream")
    assert train.classes == val.classes == ["mass", "spin"]
    assert train.labels.dtype == torch.float32 and train.labels.shape == (6, 2)
    assert torch.allclose(val.labels, torch.from_numpy(y[6:]).float())
    assert val.name == "arrays:val"
    first, _ = open_source("arrays", str(tmp_path), mode="stream", train_limit=4,
                           test_limit=2)
    assert len(first) == 4 and len(_) == 2
    assert torch.equal(first.images(range(4)), torch.from_numpy(images[:4, None]))


def test_channel_stats_match_numpy_in_float64(tmp_path: Path, monkeypatch) -> None:
    images = _fields(30, (2, 6, 5), dtype=np.float32) + 1000.0  # a large offset
    _write(tmp_path, {"images": images[:25], "targets": np.zeros(25, np.int64)},
           {"images": images[25:], "targets": np.zeros(5, np.int64)})
    values = images[:25].astype(np.float64)
    mean, std = values.mean(axis=(0, 2, 3)), values.std(axis=(0, 2, 3))
    import vitkit.data.dataset as dataset

    monkeypatch.setattr(dataset, "STATS_CHUNK_BYTES", 8 * 60 * 3)  # several chunks
    monkeypatch.setattr(sys.modules["vitkit.data.sources.mapped"], "STATS_CHUNK_BYTES",
                        8 * 60 * 3)
    for mode in ("memory", "stream"):
        train, _ = open_source("arrays", str(tmp_path), mode=mode)
        got_mean, got_std = train.channel_stats()
        assert np.allclose(got_mean, mean, rtol=0, atol=1e-9)
        assert np.allclose(got_std, std, rtol=1e-9)
    pictures = ImageDataset(torch.tensor([[[[0, 255]]], [[[51, 51]]]], dtype=torch.uint8),
                            torch.tensor([0, 1]), [])
    p_mean, p_std = pictures.channel_stats()
    as_unit = np.array([0, 255, 51, 51]) / 255
    assert np.isclose(p_mean[0], as_unit.mean()) and np.isclose(p_std[0], as_unit.std())
    flat = ImageDataset(torch.full((3, 1, 2, 2), 7.0), torch.zeros(3, dtype=torch.long), [])
    assert flat.channel_stats() == ((7.0,), (1.0,))  # no spread: std 1, only centred


def test_auto_maps_above_the_memory_limit(tmp_path: Path, monkeypatch) -> None:
    root, _, _ = _set(tmp_path / "d")
    train, _ = open_source("arrays", str(root))
    assert isinstance(train, ImageDataset)
    monkeypatch.setattr(sources, "MEMORY_LIMIT_BYTES", 1000)
    train, test = open_source("arrays", str(root))
    assert isinstance(train, MappedArrays) and isinstance(test, MappedArrays)
    with pytest.raises(ConfigError, match="data_mode=stream"):
        open_source("arrays", str(root), streaming=True)


def test_compressed_npz_is_read_into_memory_or_refused_above_the_limit(tmp_path: Path,
                                                                      monkeypatch, caplog
                                                                      ) -> None:
    images = _fields(20, (6, 5))
    arrays = ({"images": images[:15], "targets": np.arange(15) % 2},
              {"images": images[15:], "targets": np.arange(5) % 2})
    _write(tmp_path / "z", *arrays, compressed=True)
    with caplog.at_level("INFO", logger="vitkit.data"):
        train, _ = open_source("arrays", str(tmp_path / "z"), mode="stream")
    assert isinstance(train, ImageDataset) and "stored compressed" in caplog.text
    assert "batch by batch (" not in caplog.text  # not also said to be read batch by batch
    monkeypatch.setattr(sources, "MEMORY_LIMIT_BYTES", 1000)
    with pytest.raises(DataError) as caught:
        open_source("arrays", str(tmp_path / "z"), mode="stream")
    says(str(caught.value), "savez_compressed", "numpy.savez", "data_mode=memory")
    train, _ = open_source("arrays", str(tmp_path / "z"), mode="memory")  # the fix: memory
    assert torch.equal(train.images, torch.from_numpy(images[:15, None]))
    _write(tmp_path / "u", *arrays)  # the other fix: numpy.savez
    assert isinstance(open_source("arrays", str(tmp_path / "u"), mode="stream")[0],
                      MappedArrays)


def test_a_missing_relative_folder_says_where_and_the_fix_once(tmp_path: Path,
                                                               monkeypatch) -> None:
    project = tmp_path / "project"
    _set(project / "fields")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as error:
        open_source("arrays", "fields")
    message = str(error.value)
    says(message, "data=arrays", "fields", "does not exist", "relative path", str(tmp_path),
         "train.npz", "test.npz", "data_dir=DIR", "--data-dir", "full path")
    assert message.count("--data-dir") == 1 and "\n" not in message  # the fix, said once
    assert open_source("arrays", str(project / "fields"))[0] is not None  # its full path
    monkeypatch.chdir(project)  # or from the folder it is relative to
    assert open_source("arrays", "fields")[0] is not None
    with pytest.raises(DataError) as error:
        open_source("arrays", str(tmp_path / "nowhere"))
    assert "relative path" not in str(error.value)
    says(str(error.value), "nowhere", "does not exist", "--data-dir")


def test_missing_folder_and_files_are_named(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="does not exist"):
        open_source("arrays", str(tmp_path / "nowhere"))
    with pytest.raises(DataError, match="data_dir=DIR"):
        open_source("arrays", None)
    with pytest.raises(DataError, match=r"train\.npz .*train/images\.npy"):
        open_source("arrays", str(tmp_path))
    np.savez(tmp_path / "train.npz", images=_fields(4), targets=np.arange(4))
    with pytest.raises(DataError, match=r"test\.npz .* or .*val\.npz"):
        open_source("arrays", str(tmp_path))
    (tmp_path / "test").mkdir()
    np.save(tmp_path / "test" / "images.npy", _fields(4))
    with pytest.raises(DataError, match=r"test/targets\.npy"):
        open_source("arrays", str(tmp_path))
    np.save(tmp_path / "test" / "targets.npy", np.arange(4))  # what the message asks for
    assert len(open_source("arrays", str(tmp_path))[1]) == 4


def test_npz_without_the_keys_names_the_keys_it_has(tmp_path: Path) -> None:
    _write(tmp_path, {"x": _fields(4), "y": np.arange(4)},
           {"images": _fields(2), "targets": np.arange(2)})
    with pytest.raises(DataError) as caught:
        open_source("arrays", str(tmp_path))
    says(str(caught.value), "train.npz", "x, y", "numpy.savez(path, images=..., targets=...)")
    np.savez(tmp_path / "train.npz", images=_fields(4), targets=np.arange(4))
    assert len(open_source("arrays", str(tmp_path))[0]) == 4


@pytest.mark.parametrize("mode", ["memory", "stream"])
def test_bad_arrays_are_refused_by_name(tmp_path: Path, mode) -> None:
    def refused(train: dict, test: dict | None = None, layout="npz") -> str:
        root = tmp_path / f"case{len(list(tmp_path.iterdir()))}"
        _write(root, train, test or {"images": _fields(3), "targets": np.arange(3)}, layout)
        with pytest.raises(DataError) as caught:
            open_source("arrays", str(root), mode=mode)
        return str(caught.value)

    says(refused({"images": _fields(5), "targets": np.arange(4)}), "5 images", "4 targets")
    nan_y = np.ones(6)
    nan_y[[2, 4]] = np.nan
    says(refused({"images": _fields(6), "targets": nan_y}), "2 target(s)", "NaN or inf",
         "index 2, 4")
    nan_x = _fields(6)
    nan_x[3, 0, 1, 1] = np.inf
    nan_x[5, 0, 0, 0] = np.nan
    says(refused({"images": nan_x, "targets": np.arange(6)}), "image 3", "NaN or inf")
    says(refused({"images": np.zeros((6, 30), np.float32), "targets": np.arange(6)}),
         "(N, H, W)", "(N, C, H, W)", "(N, H, W, C)", "(6, 30)")
    objects = np.empty(4, dtype=object)
    objects[:] = [1, 2, 3, 4]
    assert "pickled object array" in refused({"images": _fields(4), "targets": objects})
    assert "pickled object array" in refused({"images": objects, "targets": np.arange(4)},
                                             layout="npy")
    says(refused({"images": _fields(4), "targets": np.array(list("abcd"))}), "<U1",
         "not numbers")
    other = refused({"images": _fields(4, (1, 6, 5)), "targets": np.arange(4)},
                    {"images": _fields(3, (1, 6, 4)), "targets": np.arange(3)})
    assert "1x6x4 (CxHxW)" in other and "1x6x5" in other and "one shape" in other
    channels = refused({"images": _fields(4, (2, 6, 5)), "targets": np.arange(4)},
                       {"images": _fields(3, (3, 6, 5)), "targets": np.arange(3)})
    assert "3x6x5" in channels and "2x6x5" in channels
    says(refused({"images": _fields(4), "targets": np.zeros((4, 2)),
                  "target_names": np.array(["a"])}), "1 targets", "has 2")


RSS_SCRIPT = textwrap.dedent("""
    import sys
    from vitkit.data.feeds import training_feed
    from vitkit.data.loader import BatchOrder
    from vitkit.data.sources import open_source
    train, _ = open_source("arrays", sys.argv[1], mode=sys.argv[2])
    feed = training_feed(train, BatchOrder(len(train), 64, seed=0), None, 1, (64, 64), 0)
    seen = 0
    for _, images, labels in feed.epoch(0):
        seen += len(images)
        total = float(images.sum())
    assert seen == len(train) // 64 * 64
    # this process's own peak (VmHWM): ru_maxrss would carry over the forking parent's
    with open("/proc/self/status") as status:
        print(next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM")))
""")


def _peak_rss(root: Path, mode: str) -> int:
    source = str(Path(vitkit.__file__).resolve().parents[1])  # the vitkit under test
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (source, os.environ.get("PYTHONPATH")) if p)}
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(root), mode],
                         capture_output=True, text=True, env=env)
    assert out.returncode == 0, out.stderr[-2000:]
    return int(out.stdout.split()[-1])


def test_reading_every_batch_of_a_mapped_set_keeps_rss_flat(tmp_path: Path) -> None:
    """An epoch over 10,000 64x64 float32 fields (164 MB) peaks within 60 MB of one over
    1,000; the same large set held in memory does not (so the measure can tell)."""
    for name, count in (("small", 1_000), ("large", 10_000)):
        root = tmp_path / name
        root.mkdir()
        images = np.lib.format.open_memmap(root / "images.npy", "w+", np.float32,
                                           (count, 64, 64))
        images[:] = 0.5
        images.flush()
        del images
        np.savez(root / "test.npz", images=np.zeros((2, 64, 64), np.float32),
                 targets=np.zeros(2, np.int64))
        (root / "train").mkdir()
        (root / "images.npy").rename(root / "train" / "images.npy")
        np.save(root / "train" / "targets.npy", np.arange(count) % 10)
    small, large = (_peak_rss(tmp_path / n, "stream") for n in ("small", "large"))
    assert large - small < 60 * 1024**2, (small, large)
    held = _peak_rss(tmp_path / "large", "memory")
    assert held - small > 120 * 1024**2, (small, held)


SMALL = ["data=arrays", "model.depth=1", "model.width=16", "model.num_heads=2",
         "model.mlp_dim=32", "model.patch_size=4", "model.img_size=8", "epochs=1",
         "batch_size=16", "warmup_epochs=0", "progress=false"]


def _arrays(root: Path, train_targets: np.ndarray, test_targets: np.ndarray | None = None,
            **extra) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    test_targets = train_targets if test_targets is None else test_targets
    for split, targets in (("train", train_targets), ("test", test_targets)):
        images = rng.random((len(targets), 8, 8), dtype=np.float32)
        np.savez(root / f"{split}.npz", images=images, targets=targets,
                 **(extra if split == "train" else {}))
    return root


@pytest.mark.parametrize("names, problem", [(["a", "a", "b"], ("a appear", "more than once")),
                                            (["a", " ", "b"], ("name 2 of 3", "empty"))])
def test_target_names_that_name_no_one_output_are_refused(tmp_path: Path, names, problem,
                                                          capsys) -> None:
    """Repeated or empty target names are refused, naming the name and advising a name of
    its own for each; distinct names then train."""
    targets = np.random.default_rng(1).random((32, 3), dtype=np.float32)
    data = _arrays(tmp_path / "d", targets, target_names=np.array(names))
    assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "run")]) != 0
    says(capsys.readouterr().err, "target_names", *problem, "a name of its own")
    named = _arrays(tmp_path / "named", targets, target_names=np.array(["a", "b", "c"]))
    assert main(["train", *SMALL, f"data_dir={named}", "--out", str(tmp_path / "ok")]) == 0


MODEL = "model=" + json.dumps({"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32,
                               "patch_size": 4, "img_size": [16, 16]})


QUICK = ["epochs=1", "warmup_epochs=0", "batch_size=32", "progress=false"]


def _both_splits(folder: Path, images: np.ndarray, targets: np.ndarray) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for split in ("train", "test"):
        np.savez(folder / f"{split}.npz", images=images, targets=targets)
    return folder


def _train(args: list[str], out: Path) -> int:
    return main(["train", MODEL, *QUICK, *args, "--out", str(out)])


def test_an_arrays_folder_without_data_arrays_is_named_and_the_fix_trains(
        tmp_path, capsys, caplog):
    rng = np.random.default_rng(0)
    folder = _both_splits(tmp_path / "fields", rng.random((40, 16, 16), dtype=np.float32),
                     rng.random(40, dtype=np.float32))
    assert _train([f"data_dir={folder}"], tmp_path / "r0") == 2
    err = capsys.readouterr().err
    says(err, "data=arrays", "test.npz", "train.npz")
    assert "Traceback" not in err
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r1") == 0  # the fix
    assert "task=regression" in caplog.text


def test_channels_last_arrays_with_two_channels_get_the_transpose_that_fixes_them(
        tmp_path, capsys, caplog):
    """(N, 16, 16, 2), u and v fields: read as 16 channels of 16x2; the message says how to
    give channels-last arrays, and the transposed arrays train as 2 channels of 16x16."""
    rng = np.random.default_rng(1)
    images, targets = rng.random((40, 16, 16, 2), dtype=np.float32), rng.random(40)
    folder = _both_splits(tmp_path / "uv", images, targets)
    assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r0") == 2
    err = capsys.readouterr().err
    says(err, "16x2", "16x16", "C=16", "(N, H, W, C)", "np.transpose(images, (0, 3, 1, 2))")
    two = MODEL.replace('"img_size"', '"in_chans": 2, "img_size"')  # the channels set too
    assert main(["train", two, *QUICK, "data=arrays", f"data_dir={folder}", "--out",
                 str(tmp_path / "r2")]) == 2
    says(capsys.readouterr().err, "16 channel(s)", "model.in_chans=16", "leave it unset",
         "C=16", "(N, H, W, C)", "transpose")
    fixed = _both_splits(tmp_path / "uv_first", np.transpose(images, (0, 3, 1, 2)), targets)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert _train(["data=arrays", f"data_dir={fixed}"], tmp_path / "r1") == 0
    says(caplog.text, "data=arrays", "2 input channel(s)")


def test_pictures_of_another_size_get_no_channels_hint(tmp_path, capsys):
    """Images of another size than the model's are refused naming both sizes and the
    model.img_size to set (no transpose hint); with that setting they train."""
    rng = np.random.default_rng(2)
    folder = _both_splits(tmp_path / "rgb", rng.random((40, 3, 12, 12), dtype=np.float32),
                     rng.random(40))
    assert _train(["data=arrays", f"data_dir={folder}"], tmp_path / "r0") == 2
    err = capsys.readouterr().err
    says(err, "12x12", "16x16", "model.img_size=12")
    assert "transpose" not in err and "Traceback" not in err
    assert _train(["data=arrays", f"data_dir={folder}", "model.img_size=12"],
                  tmp_path / "r1") == 0  # the advice
