"""CIFAR binary readers: the real CIFAR-10 copy, synthetic CIFAR-100, errors, safe extraction."""

from __future__ import annotations

import hashlib
import io
import tarfile
from pathlib import Path
from types import ModuleType

import numpy as np
import pytest
import torch

from vitkit.data.dataset import DataError
from vitkit.data.sources.cifar import download_cifar, find_cifar_dir, load_cifar, verify_and_extract


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


CIFAR10_CLASSES = ["airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse",
                   "ship", "truck"]


# --- real CIFAR-10 -------------------------------------------------------------------------


def test_real_train_first_batch(cifar10_dir: Path) -> None:
    ds = load_cifar(cifar10_dir, "train", limit=10_000)
    assert ds.images.shape == (10_000, 3, 32, 32)
    assert ds.images.dtype == torch.uint8
    assert ds.labels.dtype == torch.int64
    assert ds.classes == CIFAR10_CLASSES
    assert ds.name == "cifar10-train"
    # The README: every training batch holds exactly 1,000 images per class.
    assert torch.bincount(ds.labels, minlength=10).tolist() == [1000] * 10


def test_real_first_record_matches_manual_decode(cifar10_dir: Path) -> None:
    raw = np.fromfile(cifar10_dir / "data_batch_1.bin", dtype=np.uint8, count=3073)
    ds = load_cifar(cifar10_dir, "train", limit=1)
    assert len(ds) == 1
    assert ds.labels[0].item() == raw[0]
    expected = raw[1:].reshape(3, 32, 32)
    assert np.array_equal(ds.images[0].numpy(), expected)
    # Planes are R, G, B: the red plane is the first 1,024 pixel bytes, row-major.
    assert np.array_equal(ds.images[0, 0, 0].numpy(), raw[1:33])


def test_real_limit_crosses_batches(cifar10_dir: Path) -> None:
    ds = load_cifar(cifar10_dir, "train", limit=10_002)
    assert len(ds) == 10_002
    raw = np.fromfile(cifar10_dir / "data_batch_2.bin", dtype=np.uint8, count=2 * 3073)
    raw = raw.reshape(2, 3073)
    assert ds.labels[10_000:].tolist() == raw[:, 0].tolist()
    assert np.array_equal(ds.images[10_000:].numpy(), raw[:, 1:].reshape(2, 3, 32, 32))


def test_real_test_split_and_parent_root(cifar10_dir: Path) -> None:
    ds = load_cifar(cifar10_dir.parent, "test", limit=500)  # the folder containing it works too
    assert ds.images.shape == (500, 3, 32, 32)
    assert ds.name == "cifar10-test"
    assert int(ds.labels.max()) <= 9


def test_find_cifar_dir_real(cifar10_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert find_cifar_dir("cifar10", cifar10_dir) == cifar10_dir
    monkeypatch.setenv("VITKIT_CIFAR10_DIR", str(cifar10_dir.parent))
    assert find_cifar_dir("cifar10") == cifar10_dir


# --- synthetic files ------------------------------------------------------------------------


def _write_cifar10(folder: Path, split_files: dict[str, np.ndarray], meta: bool = True) -> Path:
    """Write records (label, pixels) as CIFAR-10 binary files under `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, records in split_files.items():
        records.astype(np.uint8).tofile(folder / name)
    if meta:
        (folder / "batches.meta.txt").write_text("\n".join(CIFAR10_CLASSES) + "\n\n")
    return folder


def _records(labels: list[int], label_bytes: int = 1, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    rec = rng.integers(0, 256, size=(len(labels), label_bytes + 3072), dtype=np.uint8)
    rec[:, label_bytes - 1] = labels
    return rec


def test_cifar100_reads_fine_labels(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-binary"
    folder.mkdir()
    fine = [0, 99, 42, 7, 42]
    rec = _records(fine, label_bytes=2)
    rec[:, 0] = [19, 3, 0, 5, 11]  # coarse labels, which must be ignored
    rec.tofile(folder / "train.bin")
    rec[:2].tofile(folder / "test.bin")
    (folder / "fine_label_names.txt").write_text("\n".join(f"c{i}" for i in range(100)) + "\n")

    ds = load_cifar(tmp_path, "train", dataset="cifar100")
    assert ds.labels.tolist() == fine
    assert ds.classes[:3] == ["c0", "c1", "c2"]
    assert len(ds.classes) == 100
    assert np.array_equal(ds.images.numpy(), rec[:, 2:].reshape(-1, 3, 32, 32))
    assert ds.name == "cifar100-train"
    assert len(load_cifar(folder, "test", dataset="cifar100")) == 2
    assert len(load_cifar(folder, "train", dataset="cifar100", limit=3)) == 3


def test_truncated_file_names_the_file(tmp_path: Path) -> None:
    rec = _records([1, 2, 3])
    folder = _write_cifar10(tmp_path / "cifar-10-batches-bin", {"test_batch.bin": rec})
    with open(folder / "test_batch.bin", "ab") as f:
        f.write(b"\x00" * 100)
    with pytest.raises(DataError) as caught:
        load_cifar(tmp_path, "test")
    says(str(caught.value), "test_batch.bin", "9,319 bytes", "3073-byte", "truncated")


def test_missing_batch_file(tmp_path: Path) -> None:
    files = {f"data_batch_{i}.bin": _records([i]) for i in (1, 2, 4, 5)}
    _write_cifar10(tmp_path / "cifar-10-batches-bin", files)
    with pytest.raises(DataError, match=r"data_batch_3\.bin is missing"):
        load_cifar(tmp_path, "train")
    with pytest.raises(DataError, match=r"test_batch\.bin is missing"):
        load_cifar(tmp_path, "test")


def test_label_out_of_range(tmp_path: Path) -> None:
    _write_cifar10(tmp_path, {"test_batch.bin": _records([3, 10, 2])})
    with pytest.raises(DataError) as caught:
        load_cifar(tmp_path, "test")
    says(str(caught.value), "record 1", "label 10", "0..9")


def test_wrong_number_of_class_names(tmp_path: Path) -> None:
    folder = tmp_path / "cifar-100-binary"
    folder.mkdir()
    _records([1], label_bytes=2).tofile(folder / "test.bin")
    (folder / "fine_label_names.txt").write_text("a\nb\n")
    with pytest.raises(DataError) as caught:
        load_cifar(folder, "test", dataset="cifar100")
    says(str(caught.value), "fine_label_names.txt", "2 class names", "cifar100", "100")


@pytest.mark.parametrize(("content", "problem"), [
    (np.random.default_rng(0).bytes(300), ("not UTF-8", "byte ", "invalid")),
    ("\n".join(CIFAR10_CLASSES).encode("utf-16"), ("not UTF-8", "byte 0")),
    ("\n".join(["caf\xe9", *CIFAR10_CLASSES[1:]]).encode("latin-1"), ("not UTF-8",)),
    ("\n".join(["a\x00b", *CIFAR10_CLASSES[1:]]).encode(), ("control character",
                                                           "'a\\x00b'")),
    ("\n".join(CIFAR10_CLASSES[:7]).encode(), ("7 class names", "10")),
    ("\n".join(CIFAR10_CLASSES * 2).encode(), ("20 class names",)),
    (b"x\n" * 40_000, ("80,000 bytes", "too many")),
], ids=["random-bytes", "utf-16", "latin-1", "control-char", "too-few", "too-many", "huge"])
def test_garbage_meta_file_names_file_and_fix(tmp_path: Path, content: bytes,
                                              problem: tuple[str, ...]) -> None:
    """A broken class-name file is refused naming the file and its problem, advising to
    restore it from the tarball or delete it; either fix loads."""
    folder = _write_cifar10(tmp_path / "cifar-10-batches-bin",
                            {"test_batch.bin": _records([1, 2])})
    meta = folder / "batches.meta.txt"
    meta.write_bytes(content)
    with pytest.raises(DataError) as caught:
        load_cifar(tmp_path, "test")
    says(str(caught.value), "batches.meta.txt", *problem, "restore", "cifar10 tarball",
         "delete it", "0..9")
    meta.unlink()  # the advice, first half: delete it
    assert load_cifar(tmp_path, "test").classes == [str(i) for i in range(10)]
    meta.write_text("\n".join(CIFAR10_CLASSES) + "\n")  # second half: restore it
    assert load_cifar(tmp_path, "test").classes == CIFAR10_CLASSES


def test_meta_file_with_bom_and_crlf(tmp_path: Path) -> None:
    folder = _write_cifar10(tmp_path, {"test_batch.bin": _records([0])}, meta=False)
    (folder / "batches.meta.txt").write_bytes(b"\xef\xbb\xbf" + "\r\n".join(CIFAR10_CLASSES)
                                              .encode())
    assert load_cifar(tmp_path, "test").classes == CIFAR10_CLASSES


def test_fuzzed_cifar_folders_load_or_fail_clearly(fuzzer: ModuleType) -> None:
    """Truncated, flipped-byte, resized and garbage batch and class-name files (seeded; 500
    cases, by count, not by the clock): each loads a valid dataset or raises a VitkitError that
    names the file."""
    counts = fuzzer.fuzz_cifar(500, seed=2)
    assert counts.other == 0, counts.examples
    assert counts.cases == 500 and counts.clear_error > 0 and counts.loaded > 0


def test_missing_folder_explains_fix(tmp_path: Path) -> None:
    with pytest.raises(DataError) as caught:
        load_cifar(tmp_path / "nowhere", "train")
    says(str(caught.value), "nowhere", "--data-dir", "VITKIT_CIFAR10_DIR", "download_cifar")
    with pytest.raises(DataError, match=r"VITKIT_CIFAR100_DIR"):
        load_cifar(tmp_path, "test", dataset="cifar100")


def test_a_relative_folder_not_found_says_where_it_was_looked_for_and_the_fix_works(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    project = tmp_path / "project"
    folder = project / "c100" / "cifar-100-binary"
    folder.mkdir(parents=True)
    _records([1, 2], label_bytes=2).tofile(folder / "train.bin")
    _records([3], label_bytes=2).tofile(folder / "test.bin")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(DataError) as error:
        find_cifar_dir("cifar100", "c100")
    message = str(error.value)
    says(message, "c100", "c100/cifar-100-binary", "relative path", str(tmp_path),
         "folder it is relative to", "full path", "--data-dir", "data_dir=PATH",
         "VITKIT_CIFAR100_DIR=PATH")
    assert message.count("--data-dir") == 1  # the fix said once
    assert find_cifar_dir("cifar100", project / "c100") == folder  # its full path
    monkeypatch.chdir(project)  # or from the folder it is relative to
    assert find_cifar_dir("cifar100", "c100").resolve() == folder.resolve()
    assert "relative path" not in _not_found_text(tmp_path / "nowhere")


def _not_found_text(root: Path) -> str:
    with pytest.raises(DataError) as error:
        find_cifar_dir("cifar10", root)
    return str(error.value)


def test_find_cifar_dir_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("VITKIT_CIFAR10_DIR", raising=False)
    with pytest.raises(DataError, match=r"\.cache/vitkit/cifar10.*--data-dir"):
        find_cifar_dir("cifar10")
    cached = _write_cifar10(tmp_path / "home/.cache/vitkit/cifar10/cifar-10-batches-bin",
                            {"test_batch.bin": _records([1])})
    assert find_cifar_dir("cifar10") == cached
    from_env = _write_cifar10(tmp_path / "env", {"test_batch.bin": _records([1])})
    monkeypatch.setenv("VITKIT_CIFAR10_DIR", str(from_env))
    assert find_cifar_dir("cifar10") == from_env
    with pytest.raises(DataError, match=r"looked in: .*elsewhere"):
        find_cifar_dir("cifar10", tmp_path / "elsewhere")  # an explicit dir is not second-guessed


def test_bad_arguments(tmp_path: Path) -> None:
    with pytest.raises(DataError, match="unknown CIFAR dataset 'cifar1000'"):
        load_cifar(tmp_path, "train", dataset="cifar1000")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="unknown split 'val'"):
        load_cifar(tmp_path, "val")  # type: ignore[arg-type]
    with pytest.raises(DataError, match="limit must be >= 0"):
        load_cifar(tmp_path, "test", limit=-1)


# --- checksum and extraction ---------------------------------------------------------------


def _tarball(path: Path, members: dict[str, bytes]) -> str:
    """Write a .tar.gz holding `members` (name -> bytes); return its md5."""
    with tarfile.open(path, "w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return hashlib.md5(path.read_bytes()).hexdigest()


def _cifar10_tarball(path: Path) -> tuple[str, np.ndarray]:
    rec = _records([0, 9, 4])
    members = {f"cifar-10-batches-bin/data_batch_{i}.bin": rec.tobytes() for i in range(1, 6)}
    members["cifar-10-batches-bin/test_batch.bin"] = rec[:1].tobytes()
    members["cifar-10-batches-bin/batches.meta.txt"] = "\n".join(CIFAR10_CLASSES).encode()
    return _tarball(path, members), rec


def test_verify_and_extract_ok(tmp_path: Path) -> None:
    md5, _ = _cifar10_tarball(tmp_path / "c.tar.gz")
    moved = verify_and_extract(tmp_path / "c.tar.gz", md5, tmp_path / "out")
    assert moved == [tmp_path / "out" / "cifar-10-batches-bin"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["cifar-10-batches-bin"]


def test_checksum_mismatch(tmp_path: Path) -> None:
    md5, _ = _cifar10_tarball(tmp_path / "c.tar.gz")
    with pytest.raises(DataError) as caught:
        verify_and_extract(tmp_path / "c.tar.gz", "0" * 32, tmp_path / "out")
    says(str(caught.value), "md5", "0" * 32, md5)
    assert not (tmp_path / "out" / "cifar-10-batches-bin").exists()


@pytest.mark.parametrize("name", ["../evil.txt", "ok/../../evil.txt", "/tmp/vitkit-evil.txt"])
def test_unsafe_member_rejected(tmp_path: Path, name: str) -> None:
    md5 = _tarball(tmp_path / "bad.tar.gz", {"fine.txt": b"x", name: b"evil"})
    dest = tmp_path / "a" / "b"
    with pytest.raises(DataError) as caught:
        verify_and_extract(tmp_path / "bad.tar.gz", md5, dest)
    says(str(caught.value), "refusing to extract", "'..'")
    assert not (tmp_path / "a" / "evil.txt").exists()
    assert not (tmp_path / "evil.txt").exists()
    assert list(dest.iterdir()) == []  # nothing half-extracted, staging folder removed


def test_symlink_member_rejected(tmp_path: Path) -> None:
    with tarfile.open(tmp_path / "link.tar", "w") as tar:
        info = tarfile.TarInfo("link")
        info.type = tarfile.SYMTYPE
        info.linkname = "/etc/passwd"
        tar.addfile(info)
    with pytest.raises(DataError, match="is a link"):
        verify_and_extract(tmp_path / "link.tar", None, tmp_path / "out")


def test_download_from_local_url(tmp_path: Path) -> None:
    archive = tmp_path / "cifar-10-binary.tar.gz"
    md5, rec = _cifar10_tarball(archive)
    root = tmp_path / "cache"
    folder = download_cifar("cifar10", root, url=archive.as_uri(), md5=md5)
    assert folder == root / "cifar-10-batches-bin"
    assert sorted(p.name for p in root.iterdir()) == ["cifar-10-batches-bin"]  # no temp files
    ds = load_cifar(root, "train")
    assert ds.labels.tolist() == [0, 9, 4] * 5
    assert np.array_equal(ds.images[:3].numpy(), rec[:, 1:].reshape(3, 3, 32, 32))
    # Already there: returns without downloading (this url would fail).
    assert download_cifar("cifar10", root, url=(tmp_path / "gone").as_uri()) == folder


def test_download_bad_checksum_and_missing_url(tmp_path: Path) -> None:
    archive = tmp_path / "cifar-10-binary.tar.gz"
    _cifar10_tarball(archive)
    root = tmp_path / "cache"
    with pytest.raises(DataError, match="checksum mismatch"):
        download_cifar("cifar10", root, url=archive.as_uri())  # the official md5 differs
    assert list(root.iterdir()) == []
    with pytest.raises(DataError) as caught:
        download_cifar("cifar10", root, url=(tmp_path / "missing.tar.gz").as_uri())
    says(str(caught.value), "could not download", "cifar10", "--data-dir")
    assert list(root.iterdir()) == []
