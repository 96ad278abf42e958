"""`vitkit eval` refuses data that does not fit the weights, naming both and the data to use,
and evaluating on such data works: targets of another task (class labels for a regression or
multi-label model, float or 0/1 (N, K) targets for a classifier), and images in other units
than the weights were trained on (8-bit pictures for weights of float arrays, float arrays
for weights of 8-bit pictures), which `vitkit probe` refuses as `vitkit predict` does."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch

from vitkit import create_model, save_pretrained
from vitkit.cli import main
from vitkit.preprocess import Preprocess
from vitkit.tasks import TaskSpec

TINY = {"width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32, "patch_size": 4,
        "img_size": [16, 16], "in_chans": 1}
COUNT = 12


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"


def _saved(tmp_path: Path, outputs: int, task: TaskSpec | None = None) -> Path:
    torch.manual_seed(0)
    model = create_model({**TINY, "num_classes": outputs})
    if task is not None:
        model.task = task
    model.preprocess = Preprocess(img_size=(16, 16), scale=1.0, mean=(0.5,), std=(0.25,))
    return save_pretrained(model.eval(), tmp_path / "weights")


def _arrays(tmp_path: Path, name: str, targets: np.ndarray) -> Path:
    folder = tmp_path / name
    folder.mkdir()
    images = np.random.default_rng(0).random((len(targets), 16, 16)).astype(np.float32)
    for split in ("train", "test"):
        np.savez(folder / f"{split}.npz", images=images, targets=targets)
    return folder


def _refused(capsys, weights: Path, out: Path, *data: str) -> str:
    assert main(["eval", str(weights), "--out", str(out), *data]) != 0
    err = capsys.readouterr().err
    assert "Traceback" not in err and "bug in vitkit" not in err
    return err


def _evaluated(capsys, weights: Path, out: Path, *data: str) -> dict:
    assert main(["eval", str(weights), "--out", str(out), *data]) == 0
    capsys.readouterr()
    return json.loads((out / "eval.json").read_text())


def test_a_classifier_refuses_regression_targets_and_takes_integer_labels(tmp_path, capsys):
    weights = _saved(tmp_path, 3)
    rng = np.random.default_rng(1)
    for name, targets, said in (
            ("reg1", rng.random(COUNT).astype(np.float32), "(12, 1)"),
            ("reg2", rng.random((COUNT, 2)), "(12, 2)")):
        err = _refused(capsys, weights, tmp_path / f"out-{name}", "--data", "arrays",
                       "--data-dir", str(_arrays(tmp_path, name, targets)))
        says(err, "float targets", said, "task=classification, 3 classes")
        says(err, "integer class labels", "class sub-folders", "targets.csv", "digits",
             "arrays whose targets are integers")
    for dtype in (np.int64, np.uint8, np.int16):  # the advice, in any integer dtype
        labels = _arrays(tmp_path, f"cls-{np.dtype(dtype).name}",
                         (np.arange(COUNT) % 3).astype(dtype))
        report = _evaluated(capsys, weights, tmp_path / "ok", "--data", "arrays",
                            "--data-dir", str(labels))
        assert report["images"] == COUNT and "top1" in report


def test_a_classifier_refuses_multilabel_targets(tmp_path, capsys):
    weights = _saved(tmp_path, 3)
    hot = np.random.default_rng(2).random((COUNT, 3)) > 0.5
    for name, targets in (("bool", hot), ("float", hot.astype(np.float32))):
        err = _refused(capsys, weights, tmp_path / f"out-{name}", "--data", "arrays",
                       "--data-dir", str(_arrays(tmp_path, name, targets)))
        says(err, "multi-label targets", "(12, 3)", "task=classification, 3 classes",
             "integer class labels")


def test_a_regression_model_refuses_class_labels_and_takes_float_targets(
        tmp_path, capsys, caplog):
    weights = _saved(tmp_path, 2, TaskSpec("regression", target_mean=[0.0, 0.0],
                                           target_std=[1.0, 1.0]))
    err = _refused(capsys, weights, tmp_path / "out-digits", "--data", "digits")
    says(err, "digits", "integer class labels", "task=regression, 2 output(s)",
         "2 float target(s)", "arrays whose targets are floats")
    # integers in arrays may be values (counts): scored as such, with a warning
    counts = _arrays(tmp_path, "counts", np.stack([np.arange(COUNT) % 3] * 2, 1).astype(np.int32))
    assert _evaluated(capsys, weights, tmp_path / "out-int", "--data", "arrays",
                      "--data-dir", str(counts))["task"] == "regression"
    assert "the arrays' targets are integers" not in caplog.text  # (N, 2): no class labels
    targets = _arrays(tmp_path, "targets", np.random.default_rng(3).random((COUNT, 2)))
    report = _evaluated(capsys, weights, tmp_path / "ok", "--data", "arrays",
                        "--data-dir", str(targets))
    assert report["task"] == "regression" and report["images"] == COUNT and "r2" in report


def test_a_one_output_regression_model_takes_n_float_targets(tmp_path, capsys):
    weights = _saved(tmp_path, 1, TaskSpec("regression", target_mean=[0.0], target_std=[1.0]))
    _refused(capsys, weights, tmp_path / "out-digits", "--data", "digits")
    targets = _arrays(tmp_path, "targets", np.random.default_rng(4).random(COUNT))
    report = _evaluated(capsys, weights, tmp_path / "ok", "--data", "arrays",
                        "--data-dir", str(targets))
    assert report["task"] == "regression" and report["images"] == COUNT


def test_a_multilabel_model_refuses_class_labels_and_takes_0_1_targets(tmp_path, capsys):
    weights = _saved(tmp_path, 3, TaskSpec("multilabel"))
    err = _refused(capsys, weights, tmp_path / "out-digits", "--data", "digits")
    says(err, "digits", "integer class labels", "task=multilabel, 3 output(s)",
         "3 0/1 label(s)")
    hot = np.random.default_rng(5).random((COUNT, 3)) > 0.5
    report = _evaluated(capsys, weights, tmp_path / "ok", "--data", "arrays",
                        "--data-dir", str(_arrays(tmp_path, "hot", hot)))
    assert report["task"] == "multilabel" and report["images"] == COUNT


def test_a_regression_run_on_integer_targets_is_evaluated_with_a_warning(
        tmp_path, capsys, caplog, monkeypatch):
    """A regression run on integer targets scores integer arrays as values, from any folder
    (the run recorded a relative data_dir), warning that they may be class labels; a
    classification source is refused."""
    data = _arrays(tmp_path, "ints", (np.arange(32) % 4).astype(np.int64))
    model = json.dumps(TINY)
    monkeypatch.chdir(tmp_path)
    assert main(["train", "data=arrays", "data_dir=ints", f"model={model}",
                 "task=regression", "epochs=1", "batch_size=16", "progress=false",
                 "--out", str(tmp_path / "run")]) == 0
    monkeypatch.chdir(data)  # elsewhere, the folder given whole
    report = _evaluated(capsys, tmp_path / "run", tmp_path / "ok", "--data", "arrays",
                        "--data-dir", str(data))
    assert report["task"] == "regression" and report["images"] == 32
    says(caplog.text, "targets are integers", "(32,)", "scored as values", "class labels",
         "model's task")
    err = _refused(capsys, tmp_path / "run", tmp_path / "out-digits", "--data", "digits")
    says(err, "digits", "integer class labels")


SMALL = ["data=arrays", "model.depth=1", "model.width=16", "model.num_heads=2",
         "model.mlp_dim=32", "model.patch_size=4", "model.img_size=8", "epochs=1",
         "batch_size=16", "warmup_epochs=0", "progress=false"]


def _label_arrays(root: Path, train_targets: np.ndarray,
                  test_targets: np.ndarray | None = None, **extra) -> Path:
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


def test_eval_and_probe_refuse_data_in_other_units_than_the_weights(tmp_path: Path,
                                                                    capsys) -> None:
    """As predict does, eval and probe refuse 8-bit pictures for weights trained on float
    arrays (scale 1) and float arrays for weights of 8-bit pictures, naming the units of
    each; uint8 arrays of 0-255, as the refusal advises, are scored."""
    floats = _label_arrays(tmp_path / "floats", np.arange(32) % 2)
    _pictures(tmp_path / "pics", seed=2)
    assert main(["train", *SMALL, f"data_dir={floats}", "--out", str(tmp_path / "f")]) == 0
    pictures = [item for item in SMALL if item != "data=arrays"] + ["batch_size=8"]
    assert main(["train", "data=folder", *pictures, f"data_dir={tmp_path / 'pics'}",
                 "model.in_chans=1", "--out", str(tmp_path / "p")]) == 0
    capsys.readouterr()
    for verb in ("eval", "probe"):
        assert main([verb, str(tmp_path / "f"), "--data", "folder", "--data-dir",
                     str(tmp_path / "pics")]) != 0
        says(capsys.readouterr().err, "pics", "8-bit pictures", "arrays", "divides by 1")
    assert main(["eval", str(tmp_path / "f"), "--data", "arrays", "--data-dir",
                 str(floats)]) == 0  # arrays in the units it was trained on
    for verb in ("eval", "probe"):
        assert main([verb, str(tmp_path / "p"), "--data", "arrays", "--data-dir",
                     str(floats)]) != 0
        says(capsys.readouterr().err, str(floats), "float32 arrays", "8-bit pictures",
             "divides by 255", "uint8", "(a * 255).round().clip(0, 255).astype(numpy.uint8)")

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
