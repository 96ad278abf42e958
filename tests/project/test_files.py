"""vitkit's own files (`vitkit.files`): one cache root, and atomic writes that leave the old
file or the new one, never a part, and no temporary file behind."""

from pathlib import Path

import pytest

from vitkit.files import cache_root, default_cache, write_atomic


def test_cache_root_is_vitkit_cache_else_the_home_cache(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "elsewhere"))
    assert cache_root() == tmp_path / "elsewhere"
    assert default_cache() == tmp_path / "home" / ".cache" / "vitkit"
    monkeypatch.delenv("VITKIT_CACHE")
    assert cache_root() == default_cache()


@pytest.mark.parametrize("fsync", [False, True])
def test_write_atomic_replaces_the_file_whole_or_not_at_all(tmp_path: Path, fsync: bool) -> None:
    target = tmp_path / "sub" / "state.bin"
    assert write_atomic(target, lambda out: out.write(b"old"), fsync=fsync) == target
    assert target.read_bytes() == b"old"

    def fails_halfway(out) -> None:
        out.write(b"half of the new")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        write_atomic(target, fails_halfway, suffix=".part", fsync=fsync)
    assert target.read_bytes() == b"old"  # the old file, untouched
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.bin"]  # no temp file left
    write_atomic(target, lambda out: out.write(b"new"), fsync=fsync)
    assert target.read_bytes() == b"new"
    assert sorted(p.name for p in target.parent.iterdir()) == ["state.bin"]
