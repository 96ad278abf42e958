"""A variant name given for small data (`vitkit train model=Ti/16` on the 8x8 one-channel
digits) is told every setting it needs at once (channels, image size, a patch size that
divides it), each a single shell word; followed, it trains, and its head is sized from the
data's classes (10 outputs, not ImageNet's 1000), as a folder's classes size it."""

import json
import re
import shlex
from pathlib import Path

import numpy as np

from vitkit import load_pretrained
from vitkit.cli import main


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


QUICK = ["total_steps=2", "warmup_epochs=0", "batch_size=32", "train_limit=64", "test_limit=64",
         "progress=false"]


def test_a_variant_on_the_digits_gets_every_fix_at_once_and_a_head_sized_to_the_classes(
        tmp_path: Path, capsys) -> None:
    assert main(["train", "model=Ti/16", *QUICK, "--out", str(tmp_path / "r0")]) == 2
    err = capsys.readouterr().err
    says(err, "8x8", "1 channel(s)", "224x224", "model.in_chans=1", "model.img_size=8",
         "patch_size 2, 4 or 8", "16 does not")
    fixes = shlex.split(re.search(r": set (.*?) and a patch size", err).group(1))
    patch = re.search(r"\(patch_size (\d+)", err).group(1)
    out = tmp_path / "r1"
    assert main(["train", "model=Ti/16", *fixes, f"model.patch_size={patch}", *QUICK,
                 "--out", str(out)]) == 0
    config = load_pretrained(out).config
    assert (config.num_classes, config.in_chans, config.img_size, config.patch_size) == \
        (10, 1, (8, 8), 2)


def test_an_image_size_fix_for_a_wide_image_is_one_shell_word_and_names_a_patch_that_fits(
        tmp_path: Path, capsys) -> None:
    rng = np.random.default_rng(0)
    for split, count in (("train", 32), ("test", 8)):
        np.savez(tmp_path / f"{split}.npz", images=rng.random((count, 1, 12, 20), np.float32),
                 targets=rng.random(count, np.float32))
    model = '{"variant": "Ti/8", "img_size": 16, "width": 16, "depth": 1, "num_heads": 2}'
    base = ["train", "data=arrays", f"data_dir={tmp_path}", f"model={model}", *QUICK]
    assert main([*base, "--out", str(tmp_path / "r0")]) == 2
    err = capsys.readouterr().err
    says(err, "12x20", "16x16", "model.img_size=12x20", "patch_size 2 or 4", "8 does not",
         "resize the data")
    fix = re.search(r"set (model\.img_size=\S+)", err).group(1)
    assert main([*base, fix, "model.patch_size=4", "--out", str(tmp_path / "r1")]) == 0
    assert load_pretrained(tmp_path / "r1").config.img_size == (12, 20)


def test_a_run_whose_head_the_data_did_not_size_still_resumes(tmp_path: Path) -> None:
    """A run whose recorded recipe leaves num_classes unset (which sizes a fresh head to the
    data's 10 classes) but whose checkpoint holds a 1000-class head resumes with that head."""
    import torch

    model = {"variant": "Ti/2", "img_size": 8, "in_chans": 1, "width": 16, "depth": 1,
             "num_heads": 2, "mlp_dim": 32}
    out = tmp_path / "old"
    assert main(["train", f"model={json.dumps({**model, 'num_classes': 1000})}", *QUICK,
                 "--out", str(out)]) == 0
    state = torch.load(out / "last.pt", weights_only=True)
    state["train_config"]["model"] = model  # as an older run recorded it: no num_classes
    torch.save(state, out / "last.pt")
    assert main(["train", "--resume", str(out / "last.pt"), "total_steps=3"]) == 0
    assert load_pretrained(out / "last.pt").config.num_classes == 1000
