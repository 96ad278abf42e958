"""Training and evaluating regression and multi-label models end to end on small generated
arrays (data=arrays): the task's metrics per evaluation, best.pt by its primary metric, and
`vitkit eval`'s numbers against scikit-learn's, computed from the model's own predictions."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from sklearn.metrics import (
    average_precision_score,
    f1_score,
    mean_absolute_error,
    r2_score,
    root_mean_squared_error,
)

from vitkit import load_pretrained
from vitkit.cli import main
from vitkit.data.augment import AugmentConfig, BatchAugment
from vitkit.errors import ConfigError, DataError
from vitkit.tasks import TaskSpec, make_task
from vitkit.train.checkpoint import load_state
from vitkit.train.config import load_train_config
from vitkit.train.data import augment_config
from vitkit.train.loop import run_loop
from vitkit.train.setup import build_run
from vitkit.weights import save_pretrained

TINY = json.dumps({"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "patch_size": 4,
                   "img_size": [16, 16]})
QUICK = ["progress=false", "batch_size=32", "lr=0.002", "warmup_epochs=0.5",
         "eval_batch_size=64"]
TOL = 1e-5


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


# -- generated data -------------------------------------------------------------------------
def _regression_set(folder: Path, seed: int = 0) -> Path:
    """1-channel 16x16 fields in [0, 1]: noise plus a brightness b in the top-left 8x8
    quadrant; the target is the quadrant's mean intensity (about b + 0.1)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 256), ("test", 96)):
        images = rng.random((n, 16, 16), dtype=np.float32) * 0.2
        images[:, :8, :8] += rng.random(n, dtype=np.float32)[:, None, None]
        np.savez(folder / f"{split}.npz", images=images,
                 targets=images[:, :8, :8].mean((1, 2)))
    return folder


def _two_target_set(folder: Path, seed: int = 1) -> Path:
    """2-channel fields; targets: channel 0's top-left mean and 10 x channel 1's bottom-right
    mean (two outputs of different scales)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    for split, n in (("train", 256), ("test", 96)):
        images = rng.random((n, 2, 16, 16), dtype=np.float32) * 0.2
        images[:, 0, :8, :8] += rng.random(n, dtype=np.float32)[:, None, None]
        images[:, 1, 8:, 8:] += rng.random(n, dtype=np.float32)[:, None, None]
        targets = np.stack([images[:, 0, :8, :8].mean((1, 2)),
                            10 * images[:, 1, 8:, 8:].mean((1, 2))], 1)
        np.savez(folder / f"{split}.npz", images=images, targets=targets)
    return folder


def _multilabel_set(folder: Path, seed: int = 2) -> Path:
    """Label q (q = 0, 1, 2) is "a bright blob in quadrant q" (each present with p = 0.5)."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    corners = ((0, 0), (0, 8), (8, 0))
    for split, n in (("train", 384), ("test", 96)):
        images = rng.random((n, 16, 16), dtype=np.float32) * 0.3
        labels = (rng.random((n, 3)) < 0.5).astype(np.int64)
        for q, (top, left) in enumerate(corners):
            images[labels[:, q] == 1, top + 2:top + 6, left + 2:left + 6] += 1.0
        np.savez(folder / f"{split}.npz", images=images, targets=labels)
    return folder


def _train(data_dir: Path, out: Path, *extra: str) -> None:
    assert main(["train", "data=arrays", f"data_dir={data_dir}", f"model={TINY}", *QUICK,
                 *extra, "--out", str(out)]) == 0


def _rows(run: Path) -> list[dict[str, float]]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def _eval_json(run: Path) -> dict:
    assert main(["eval", str(run)]) == 0
    return json.loads((run / "eval.json").read_text())


def _predict(run: Path, data_dir: Path) -> tuple[torch.Tensor, np.ndarray, TaskSpec]:
    """The run's best model on test.npz, normalised by hand from the stored mean/std, and
    its outputs decoded by the stored task; the raw targets."""
    model = load_pretrained(run)
    with np.load(data_dir / "test.npz") as archive:
        images, targets = archive["images"], archive["targets"]
    if images.ndim == 3:
        images = images[:, None]
    pre = model.preprocess
    mean = np.asarray(pre.mean, dtype=np.float32)[None, :, None, None]
    std = np.asarray(pre.std, dtype=np.float32)[None, :, None, None]
    with torch.no_grad():
        outputs = model(torch.from_numpy((images - mean) / std))
    return make_task(model.task).decode(outputs), targets, model.task


@pytest.fixture(scope="module")
def regression_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("regression")
    data = _regression_set(root / "arrays")
    _train(data, root / "run", "epochs=8")
    return data, root / "run"


# -- regression -----------------------------------------------------------------------------
def test_regression_logs_its_metrics_and_keeps_the_best_r2(regression_run):
    data, run = regression_run
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"test_loss", "mae", "rmse", "r2"} <= set(header) and "top1" not in header
    rows = _rows(run)
    best = max(rows, key=lambda row: row["r2"])
    assert load_state(run / "best.pt")["position"]["best_score"] == best["r2"]
    assert (run / "learning_curve.png").stat().st_size > 0
    # the task and the float preprocessing are stored with the weights
    with np.load(data / "train.npz") as archive:
        images, targets = archive["images"].astype(np.float64), archive["targets"]
    model = load_pretrained(run)
    assert model.task.kind == "regression" and model.task.loss == "mse"
    assert model.task.target_mean == pytest.approx([targets.mean()], rel=1e-6)
    assert model.task.target_std == pytest.approx([targets.std()], rel=1e-6)
    assert model.preprocess.scale == 1
    assert model.preprocess.mean == pytest.approx([images.mean()], rel=1e-6)
    assert model.preprocess.std == pytest.approx([images.std()], rel=1e-6)


def test_regression_eval_equals_scikit_learn_and_beats_the_mean(regression_run):
    data, run = regression_run
    report = _eval_json(run)
    predicted, truth, _ = _predict(run, data)
    predicted = predicted[:, 0].numpy()
    assert report["task"] == "regression" and report["images"] == len(truth)
    assert report["r2"] == pytest.approx(r2_score(truth, predicted), abs=TOL)
    assert report["mae"] == pytest.approx(mean_absolute_error(truth, predicted), abs=TOL)
    assert report["rmse"] == pytest.approx(root_mean_squared_error(truth, predicted), abs=TOL)
    assert report["per_output"]["0"]["r2"] == pytest.approx(report["r2"])
    assert "top1" not in report and "confusion" not in report
    assert not (run / "confusion_matrix.png").exists()
    assert report["r2"] > 0.5  # predicting the mean scores 0
    # best.pt's own evaluation during training is what `vitkit eval` reproduces
    assert report["r2"] == pytest.approx(max(row["r2"] for row in _rows(run)), abs=TOL)


def test_a_saved_regression_model_keeps_its_task(regression_run, tmp_path):
    _, run = regression_run
    model = load_pretrained(run)
    save_pretrained(model, tmp_path / "saved")
    again = load_pretrained(tmp_path / "saved")
    assert again.task == model.task
    # a folder written before tasks (no "task" in config.json) reads as classification
    meta = json.loads((tmp_path / "saved" / "config.json").read_text())
    del meta["task"]
    (tmp_path / "saved" / "config.json").write_text(json.dumps(meta))
    assert load_pretrained(tmp_path / "saved").task is None


def test_two_targets_from_two_channels(tmp_path):
    data = _two_target_set(tmp_path / "arrays")
    _train(data, tmp_path / "run", "epochs=6", "loss=huber")
    report = _eval_json(tmp_path / "run")
    predicted, truth, task = _predict(tmp_path / "run", data)
    model = load_pretrained(tmp_path / "run")
    assert (model.config.in_chans, model.config.num_classes) == (2, 2)
    assert task.loss == "huber"
    predicted = predicted.numpy()
    assert report["r2"] == pytest.approx(r2_score(truth, predicted), abs=TOL)
    per_output = r2_score(truth, predicted, multioutput="raw_values")
    assert [report["per_output"][k]["r2"] for k in ("0", "1")] == pytest.approx(per_output,
                                                                              abs=TOL)
    assert report["mae"] == pytest.approx(mean_absolute_error(truth, predicted), abs=TOL)
    assert report["rmse"] == pytest.approx(root_mean_squared_error(truth, predicted), abs=TOL)


# -- multi-label ----------------------------------------------------------------------------
def test_multilabel_trains_and_eval_equals_scikit_learn(tmp_path, capsys):
    data = _multilabel_set(tmp_path / "arrays")
    run = tmp_path / "run"
    _train(data, run, "task=multilabel", "epochs=8", "augment.flip=true")
    assert "test mAP" in capsys.readouterr().out
    header = (run / "metrics.csv").read_text().splitlines()[0].split(",")
    assert {"test_loss", "map", "f1"} <= set(header)
    best = max(_rows(run), key=lambda row: row["map"])
    assert load_state(run / "best.pt")["position"]["best_score"] == best["map"]
    report = _eval_json(run)
    probs, truth, task = _predict(run, data)
    probs = probs.numpy()
    assert task.kind == "multilabel"
    assert report["map"] == pytest.approx(average_precision_score(truth, probs,
                                                                  average="macro"), abs=TOL)
    assert report["f1"] == pytest.approx(f1_score(truth, probs >= 0.5, average="macro",
                                                  zero_division=0), abs=TOL)
    per_label = average_precision_score(truth, probs, average=None)
    assert [report["per_label"][k]["ap"] for k in ("0", "1", "2")] == pytest.approx(
        per_label, abs=TOL)
    assert report["map"] > 0.75  # chance is the positive rate, about 0.5


# -- what does not fit is refused before training -------------------------------------------
@pytest.fixture(scope="module")
def small_set(tmp_path_factory):
    return _regression_set(tmp_path_factory.mktemp("small") / "arrays")


def _refused(capsys, data: Path, out: Path, *extra: str) -> str:
    code = main(["train", "data=arrays", f"data_dir={data}", f"model={TINY}", *QUICK, *extra,
                 "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err, err
    assert not (out / "last.pt").exists()
    return err


def test_settings_that_do_not_fit_the_task_or_the_data_are_refused(small_set, tmp_path,
                                                                     capsys):
    err = _refused(capsys, small_set, tmp_path / "a", "augment.label_smoothing=0.1")
    says(err, "augment.label_smoothing=0.1", "classification")
    err = _refused(capsys, small_set, tmp_path / "b", "augment.trivial_augment=true")
    assert "augment.trivial_augment=True" in err and "float arrays" in err
    err = _refused(capsys, small_set, tmp_path / "c", "augment.random_erasing=0.25",
                   "augment.crop_padding=2")
    assert "augment.crop_padding=2, augment.random_erasing=0.25" in err
    err = _refused(capsys, small_set, tmp_path / "d", "task=classification")
    says(err, "task=classification", "(N,)", "class indices", "task=regression")
    err = _refused(capsys, small_set, tmp_path / "e", "task=multilabel")
    says(err, "task=multilabel", "(N, K)", "0 and 1")


def test_a_head_of_another_size_is_refused_and_the_fix_trains(small_set, tmp_path, capsys):
    model = json.dumps({**json.loads(TINY), "num_classes": 3})
    code = main(["train", "data=arrays", f"data_dir={small_set}", f"model={model}", *QUICK,
                 "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert code == 2 and "model.num_classes=3 but task=regression" in err
    assert "set model.num_classes=1" in err
    _train(small_set, tmp_path / "b", "model.num_classes=1", "total_steps=2")
    assert load_pretrained(tmp_path / "b").config.num_classes == 1


@pytest.mark.parametrize("given, meant, meaning", [
    ("mae", "l1", "mean absolute error"),
    ("mean_squared_error", "mse", "mean squared error"),
    ("smooth_l1", "huber",
     "Huber loss with delta 1 on the standardised targets, the same as smooth L1 with beta 1")])
def test_another_name_of_a_loss_suggests_vitkits_name_and_the_suggestion_trains(
        small_set, tmp_path, capsys, given, meant, meaning):
    """A common name of a loss is refused, suggesting the loss it names (by meaning, not by
    spelling), and the suggestion trains."""
    err = _refused(capsys, small_set, tmp_path / "a", f"loss={given}")
    says(err, f"loss={given!r}", "not a loss", "cross_entropy, mse, huber, l1, bce",
         f"Did you mean {meant!r}", meaning)
    _train(small_set, tmp_path / "b", f"loss={meant}", "total_steps=2")
    assert load_pretrained(tmp_path / "b").task.loss == meant


def test_explicit_in_chans_that_differs_from_the_arrays_is_refused(small_set, tmp_path,
                                                                  capsys):
    model = json.dumps({**json.loads(TINY), "in_chans": 3})
    code = main(["train", "data=arrays", f"data_dir={small_set}", f"model={model}", *QUICK,
                 "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    assert code == 2 and "model.in_chans=3 but the arrays" in err
    assert "set model.in_chans=1" in err
    _train(small_set, tmp_path / "b", "model.in_chans=1", "total_steps=2")


# -- augmentation of float arrays -----------------------------------------------------------
def test_float_arrays_take_flips_only_when_asked_and_mixup_mixes_values(small_set, tmp_path):
    base = ["data=arrays", f"data_dir={small_set}", f"model={TINY}"]
    quiet = augment_config(load_train_config(None, base), False, TaskSpec("regression"), True)
    assert (quiet.crop_padding, quiet.flip, quiet.trivial_augment, quiet.random_erasing) == \
        (0, False, False, 0.0)
    asked = augment_config(load_train_config(None, [*base, "augment.flip=true"]), False,
                           TaskSpec("regression"), True)
    assert asked.flip
    task = make_task(TaskSpec("regression", target_mean=[1.0], target_std=[2.0]))
    augment = BatchAugment(AugmentConfig(crop_padding=0, flip=False, mixup_alpha=0.8), 1, task)
    images = torch.rand(4, 1, 8, 8) * 50  # float arrays in their own units
    values = torch.tensor([[1.0], [3.0], [5.0], [9.0]])
    x, y = augment(images, values, torch.Generator().manual_seed(0), (25.0,), (10.0,), 1.0)
    standard = (values - 1.0) / 2.0
    lam = float((y[0] - standard[3]) / (standard[0] - standard[3]))
    assert torch.allclose(y, lam * standard + (1 - lam) * standard.flip(0))
    normalized = (images - 25.0) / 10.0
    assert torch.allclose(x, lam * normalized + (1 - lam) * normalized.flip(0), atol=1e-5)


# -- resume -----------------------------------------------------------------------------------
def test_a_regression_run_resumes_exactly(small_set, tmp_path):
    overrides = ["data=arrays", f"data_dir={small_set}", f"model={TINY}", *QUICK, "epochs=2",
                 "augment.flip=true", "augment.mixup_alpha=0.8", "ema_decay=0.9",
                 "model.dropout=0.1", "loss=huber"]
    straight = load_train_config(None, [*overrides, f"out_dir={tmp_path / 'a'}"])
    run_loop(build_run(straight))

    split = load_train_config(None, [*overrides, f"out_dir={tmp_path / 'b'}"])
    first = build_run(split)
    halfway = first.position.total_steps // 2 + 3  # mid-epoch
    step = first.step

    def stop_halfway(images, labels, lr, position):
        if first.position.step == halfway - 1:
            first.stop.reason = "SIGTERM"
        return step(images, labels, lr, position)

    first.step = stop_halfway
    run_loop(first)
    assert load_state(tmp_path / "b" / "last.pt")["position"]["step"] == halfway
    resumed = build_run(split, resume=tmp_path / "b" / "last.pt")
    assert resumed.task.spec == first.task.spec and resumed.preprocess == first.preprocess
    run_loop(resumed)
    a, b = load_state(tmp_path / "a" / "last.pt"), load_state(tmp_path / "b" / "last.pt")
    assert a["task"] == b["task"] and a["task"]["kind"] == "regression"
    for key in ("model", "ema"):
        assert a[key].keys() == b[key].keys()
        for name in a[key]:
            assert torch.equal(a[key][name], b[key][name]), f"{key}.{name} differs"
    assert [row["r2"] for row in a["history"]] == [row["r2"] for row in b["history"]]


def test_resuming_with_another_task_is_refused(small_set, tmp_path):
    overrides = ["data=arrays", f"data_dir={small_set}", f"model={TINY}", *QUICK,
                 "total_steps=2", f"out_dir={tmp_path}"]
    run_loop(build_run(load_train_config(None, overrides)))
    with pytest.raises(ConfigError) as caught:
        build_run(load_train_config(None, [*overrides, "loss=l1"]),
                  resume=tmp_path / "last.pt")
    says(str(caught.value), "loss=l1", "trained with loss=mse", "resume with loss=mse")
    resumed = build_run(load_train_config(None, [*overrides, "loss=mse"]),  # the advice
                        resume=tmp_path / "last.pt")
    assert resumed.task.spec.loss == "mse"
    with pytest.raises(DataError):
        build_run(load_train_config(None, [*overrides, "task=classification"]))


def test_a_recipe_file_extends_an_arrays_run_from_the_cli(small_set, tmp_path):
    """The recipe's model leaves in_chans and num_classes to the data: resuming with it is
    not refused as another model."""
    recipe = tmp_path / "field.json"
    recipe.write_text(json.dumps({"data": "arrays", "data_dir": str(small_set),
                                  "model": json.loads(TINY), "total_steps": 4,
                                  "batch_size": 32, "warmup_steps": 1, "progress": False}))
    out = tmp_path / "run"
    assert main(["train", str(recipe), "--out", str(out)]) == 0
    assert main(["train", str(recipe), "total_steps=8", "--resume", str(out)]) == 0
    state = load_state(out / "last.pt")
    assert state["position"]["step"] == 8 and state["task"]["kind"] == "regression"
