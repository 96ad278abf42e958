"""A run's checkpoints are not lost to a mistyped --out: `vitkit export` refuses to write its
graph over a file that is not an .onnx graph (best.pt, a .pth) and names an .onnx path that
works. A run folder whose best.pt was replaced or emptied is refused by name, with the run's
last.pt as the fix, and an empty weights file is said to be empty (saved, copied or
downloaded), not to need downloading again."""

import hashlib
import shutil
from pathlib import Path

import pytest
import torch

from vitkit.catalog import load_pretrained
from vitkit.cli import main


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.mark.parametrize("name", ["best.pt", "weights.pth"])
def test_export_refuses_to_write_over_a_file_that_is_not_onnx(digits_run, tmp_path, capsys, name):
    copy = tmp_path / "run"
    shutil.copytree(digits_run, copy)
    target = copy / name
    if not target.exists():
        torch.save(load_pretrained(digits_run).state_dict(), target)
    before = _digest(target)
    assert main(["export", str(copy), "--out", str(target)]) == 2
    err = capsys.readouterr().err
    advised = target.with_suffix(".onnx")
    assert f"--out {target} is an existing file that is not an .onnx graph, and exporting " \
        f"would replace it: give a path ending in .onnx, e.g. --out {advised}" in err
    assert _digest(target) == before
    assert main(["export", str(copy), "--out", str(advised)]) == 0  # the advice followed
    assert advised.stat().st_size > 0 and _digest(target) == before
    assert main(["export", str(copy), "--out", str(advised)]) == 0  # an .onnx is replaced


def test_a_run_whose_best_checkpoint_was_replaced_names_its_last(digits_run, tmp_path, capsys):
    copy = tmp_path / "run"
    shutil.copytree(digits_run, copy)
    for content in (b"", b"\x08\x07\x12\x07pytorch" + bytes(200)):  # emptied; an ONNX header
        (copy / "best.pt").write_bytes(content)
        assert main(["predict", str(copy), "--sample"]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "bug" not in err
        what = "is empty, which a run's checkpoint never is" if not content else \
            "is not a vitkit training checkpoint (it holds bytes of no format vitkit reads)"
        assert f"{copy / 'best.pt'} {what}" in err
        assert f"(the run's last.pt may be whole: pass it instead, {copy / 'last.pt'})" in err
        assert main(["predict", str(copy / "last.pt"), "--sample"]) == 0  # the advice followed
    (copy / "last.pt").unlink()
    assert main(["eval", str(copy)]) == 2
    assert "it was replaced or damaged; pass the weights file itself if it is one, or train " \
        "again" in capsys.readouterr().err


def test_an_empty_weights_file_is_not_said_to_be_a_download(tmp_path, capsys):
    """A 0-byte weights file (an interrupted copy, save or download) is said to be empty and
    to hold no weights, naming saving and copying beside downloading as the fix."""
    from vitkit.cli import main

    path = tmp_path / "model.safetensors"
    path.write_bytes(b"")
    assert main(["summary", str(path)]) == 2
    err = capsys.readouterr().err
    for part in (str(path), "empty (0 bytes)", "no weights", "save, copy or download"):
        assert part in err, err

