"""Integer array labels are class indices; names are outputs' names. Each case here failed
before: a held-out class the training split lacked crashed the first evaluation (a raw
IndexError), labels such as 1000-1002 made a 1,003-way head, explain crashed on a run whose
classes have no names, repeated target names folded two outputs into one in the reports,
and probe read cached features of data edited since; eval and probe scored data in other
units than the weights were trained on (8-bit pictures for weights of float arrays), which
predict refuses."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch

from vitkit.cli import main
from vitkit.errors import DataError
from vitkit.evaluation.features import frozen_features

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


def _pictures(root: Path, seed: int) -> None:
    """An image folder of 8x8 gray PNGs: train/ and val/, classes a and b, 4 images each."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for name in ("a", "b"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(4):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(
                    folder / f"{index}.png")


def test_a_held_out_class_the_training_split_lacks_gets_an_output(tmp_path: Path,
                                                                  caplog) -> None:
    data = _arrays(tmp_path / "d", np.arange(32) % 3, np.arange(32) % 4)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "run")]) == 0
    assert "class index(es) 3 occur in the held-out split but never in training" in caplog.text
    weights = torch.load(tmp_path / "run" / "last.pt", weights_only=True)["model"]
    assert weights["head.weight"].shape[0] == 4
    assert main(["eval", str(tmp_path / "run"), "--out", str(tmp_path / "eval")]) == 0


def test_classes_numbered_from_one_are_warned_of_and_numbering_from_zero_is_quiet(
        tmp_path: Path, caplog) -> None:
    """Labels 1..3 made a 4-way head whose output 0 is never trained, without a word (a
    targets.csv said so)."""
    data = _arrays(tmp_path / "d", np.arange(32) % 3 + 1)
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "r1")]) == 0
    assert "class index(es) 0 occur in neither split (classes numbered from 1?), but the head " \
        "has an output for each, never trained: number the classes 0..2" in caplog.text
    caplog.clear()
    renumbered = _arrays(tmp_path / "d0", np.arange(32) % 3)  # the advice followed
    with caplog.at_level(logging.INFO, logger="vitkit"):
        assert main(["train", *SMALL, f"data_dir={renumbered}", "--out",
                     str(tmp_path / "r0")]) == 0
    assert "occur in neither split" not in caplog.text
    assert torch.load(tmp_path / "r0" / "last.pt", weights_only=True)["model"][
        "head.weight"].shape[0] == 3


def test_labels_that_are_no_class_indices_are_refused_and_both_fixes_work(
        tmp_path: Path, capsys) -> None:
    data = _arrays(tmp_path / "ids", np.arange(32) % 3 + 1000)
    assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "a")]) != 0
    err = capsys.readouterr().err
    assert "the integer labels are read as class indices, which run to 1002 while only 3 " \
        "occur, so the head would have 1003 outputs, most never trained: number the classes " \
        "0..2 in both splits, or, if the labels are quantities (counts, measurements), train " \
        "task=regression" in err
    assert main(["train", *SMALL, f"data_dir={data}", "task=regression",
                 "--out", str(tmp_path / "b")]) == 0
    renumbered = _arrays(tmp_path / "renumbered", np.arange(32) % 3)
    assert main(["train", *SMALL, f"data_dir={renumbered}", "--out", str(tmp_path / "c")]) == 0
    head = torch.load(tmp_path / "c" / "last.pt", weights_only=True)["model"]["head.weight"]
    assert head.shape[0] == 3


def test_explain_names_classes_the_data_does_not_name(tmp_path: Path) -> None:
    data = _arrays(tmp_path / "d", (np.arange(32) % 3).astype(np.uint8))
    assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "run")]) == 0
    assert main(["explain", str(tmp_path / "run"), "--num-images", "3",
                 "--out", str(tmp_path / "explained")]) == 0
    explained = json.loads((tmp_path / "explained" / "explain.json").read_text())
    shown = explained["images"]
    # "arrays test #11: class 2 -> class 1 (34%)": the true class, then the prediction
    assert {line.split(": ")[1].split(" -> ")[0] for line in shown} == \
        {"class 0", "class 1", "class 2"}
    for line, predicted in zip(shown, explained["predictions"], strict=True):
        top = predicted["top"][0]  # the JSON names the prediction as the title does
        assert top["label"] == f"class {top['index']}"
        assert line.split(" -> ")[1].startswith(f"{top['label']} (")


@pytest.mark.parametrize("names, problem", [(["a", "a", "b"], "a appear(s) more than once"),
                                            (["a", " ", "b"], "name 2 of 3 is empty")])
def test_target_names_that_name_no_one_output_are_refused(tmp_path: Path, names, problem,
                                                          capsys) -> None:
    targets = np.random.default_rng(1).random((32, 3), dtype=np.float32)
    data = _arrays(tmp_path / "d", targets, target_names=np.array(names))
    assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "run")]) != 0
    assert f"target_names: {problem}; give each target or class a name of its own" in \
        capsys.readouterr().err


def test_a_table_whose_header_repeats_a_column_is_refused(tmp_path: Path) -> None:
    from PIL import Image

    from vitkit.data.sources.table import read_table

    split = tmp_path / "train"
    split.mkdir()
    Image.new("RGB", (8, 8)).save(split / "a.png")
    (split / "targets.csv").write_text("file,mass,mass\na.png,1.0,2.0\n")
    with pytest.raises(DataError, match=r"among the target column names, mass appear\(s\) more "
                                        r"than once; give each column a name of its own"):
        read_table(split)


def test_features_of_data_edited_since_are_extracted_again(tmp_path: Path, caplog) -> None:
    data = _arrays(tmp_path / "d", np.arange(32) % 3)
    assert main(["train", *SMALL, f"data_dir={data}", "--out", str(tmp_path / "run")]) == 0
    first = frozen_features(tmp_path / "run")
    assert frozen_features(tmp_path / "run").from_cache  # unchanged: from the cache
    test = dict(np.load(data / "test.npz"))
    np.savez(data / "test.npz", images=test["images"], targets=(test["targets"] + 1) % 3)
    again = frozen_features(tmp_path / "run")
    assert not again.from_cache
    assert np.array_equal(again.test_y, (first.test_y + 1) % 3)


def test_eval_and_probe_refuse_data_in_other_units_than_the_weights(tmp_path: Path,
                                                                    capsys) -> None:
    """As predict refuses such files: 0-255 pictures for weights of float arrays (scale 1)
    gave an R^2 of -4 without a word, and float arrays for weights of 8-bit pictures were
    read as 0-255 values; uint8 arrays of 0-255, as the refusal advises, are scored."""
    floats = _arrays(tmp_path / "floats", np.arange(32) % 2)
    _pictures(tmp_path / "pics", seed=2)
    assert main(["train", *SMALL, f"data_dir={floats}", "--out", str(tmp_path / "f")]) == 0
    pictures = [item for item in SMALL if item != "data=arrays"] + ["batch_size=8"]
    assert main(["train", "data=folder", *pictures, f"data_dir={tmp_path / 'pics'}",
                 "model.in_chans=1", "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    for verb in ("eval", "probe"):
        assert main([verb, str(tmp_path / "f"), "--data", "folder", "--data-dir",
                     str(tmp_path / "pics")]) != 0
        assert "pics holds 8-bit pictures, but the weights were trained on arrays in their " \
            "data's own units (their preprocessing divides by 1, not 255)" in \
            capsys.readouterr().err
    assert main(["eval", str(tmp_path / "f"), "--data", "arrays", "--data-dir",
                 str(floats)]) == 0  # arrays in the units it was trained on
    for verb in ("eval", "probe"):
        assert main([verb, str(tmp_path / "p"), "--data", "arrays", "--data-dir",
                     str(floats)]) != 0
        assert f"{floats} holds float32 arrays, but the weights were trained on 8-bit pictures " \
            "(their preprocessing divides by 255), so the arrays' values would be misread as " \
            "0-255: save them as uint8 arrays of 0-255 (for values in [0, 1]: (a * 255).round()" \
            ".clip(0, 255).astype(numpy.uint8))" in capsys.readouterr().err
    as_bytes = tmp_path / "bytes"  # the advice followed
    as_bytes.mkdir()
    for split in ("train", "test"):
        held = dict(np.load(floats / f"{split}.npz"))
        a = held["images"]
        np.savez(as_bytes / f"{split}.npz", targets=held["targets"],
                 images=(a * 255).round().clip(0, 255).astype(np.uint8))
    assert main(["eval", str(tmp_path / "p"), "--data", "arrays", "--data-dir", str(as_bytes),
                 "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["images"] == 32


def test_fine_tuning_weights_of_arrays_on_pictures_reads_them_as_pictures(tmp_path: Path,
                                                                          capsys) -> None:
    """Before, the arrays' preprocessing (scale 1) was kept: the run trained on raw 0-255
    values, and its weights then refused the very pictures they were tuned on."""
    floats = _arrays(tmp_path / "floats", np.arange(32) % 2)
    assert main(["train", *SMALL, f"data_dir={floats}", "--out", str(tmp_path / "f")]) == 0
    _pictures(tmp_path / "pics", seed=3)
    assert main(["finetune", str(tmp_path / "f"), "--data", "folder", "--data-dir",
                 str(tmp_path / "pics"), "total_steps=2", "warmup_steps=0", "batch_size=8",
                 "accum_steps=1", "progress=false", "--out", str(tmp_path / "tuned")]) == 0
    saved = torch.load(tmp_path / "tuned" / "last.pt", weights_only=True)["preprocess"]
    assert saved["scale"] == 255 and saved["mean"] == [0.5]
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "tuned"),
                 str(tmp_path / "pics" / "val" / "a" / "0.png")]) == 0
