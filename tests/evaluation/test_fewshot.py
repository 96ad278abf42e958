"""Few-shot linear evaluation equals big_vision's formula, and `vitkit fewshot` runs end to end.

References are independent of the implementation under test: a direct solve of the normal
equations (X^T X + l2 I) W = X^T Y with the same standardisation (training mean and population
std + 1e-5), bias feature (100) and {-1, 1} targets, in both the primal (N >= D) and the dual
(D > N) regime. Tolerance: weights within 1e-8 relative (max abs difference over max abs
weight), identical predictions.
"""

from __future__ import annotations

import json
import logging

import numpy as np
import pytest
import torch

from vitkit.catalog import load_pretrained
from vitkit.cli import main
from vitkit.errors import InputError
from vitkit.evaluation import fewshot_lsr_accuracy, fewshot_lsr_predictions, ridge_solver
from vitkit.evaluation.fewshot import fewshot_curve, sample_shots
from vitkit.weights import save_pretrained

REL_TOL = 1e-8


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"


def normal_equations(x: np.ndarray, y: np.ndarray, num_classes: int, l2: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(W, mean, std) by solving (X^T X + l2 I) W = X^T Y directly (no eigendecomposition)."""
    mean, std = x.mean(0), x.std(0) + 1e-5
    design = np.hstack([(x - mean) / std, np.full((len(x), 1), 100.0)])
    targets = 2.0 * np.eye(num_classes)[y] - 1.0
    gram = design.T @ design + l2 * np.eye(design.shape[1])
    return np.linalg.solve(gram, design.T @ targets), mean, std


def _problem(n: int, d: int, classes: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, d))
    y = np.arange(n) % classes
    x = centres[y] + 1.5 * rng.normal(size=(n, d)) + 3.0  # offset: standardisation matters
    y_test = rng.integers(0, classes, 400)
    x_test = centres[y_test] + 1.5 * rng.normal(size=(400, d)) + 3.0
    return x, y, x_test, y_test


@pytest.mark.parametrize(("n", "d", "regime"), [(300, 20, "primal"), (30, 100, "dual")])
@pytest.mark.parametrize("l2", [1.0, 1024.0])
def test_ridge_weights_and_predictions_equal_the_normal_equations(n, d, regime, l2):
    x, y, x_test, y_test = _problem(n, d, classes=5)
    solver = ridge_solver(x, y, 5)
    assert solver.dual == (regime == "dual")
    reference, mean, std = normal_equations(x, y, 5, l2)
    weights = solver.weights(l2)
    assert np.abs(weights - reference).max() <= REL_TOL * np.abs(reference).max()
    design = np.hstack([(x_test - mean) / std, np.full((len(x_test), 1), 100.0)])
    expected = np.argmax(design @ reference, axis=1)
    np.testing.assert_array_equal(solver.predict(x_test, l2), expected)
    assert fewshot_lsr_accuracy(x, y, x_test, y_test, 5, l2) == np.mean(expected == y_test)


def test_one_decomposition_serves_every_l2():
    x, y, _, _ = _problem(40, 60, classes=4)
    solver = ridge_solver(x, y, 4)
    for l2 in (0.1, 10.0, 1e4):
        reference, _, _ = normal_equations(x, y, 4, l2)
        assert np.abs(solver.weights(l2) - reference).max() <= REL_TOL * np.abs(reference).max()


def test_numpy_and_torch_inputs_give_the_same_result():
    x, y, x_test, y_test = _problem(200, 16, classes=4)
    from_numpy = fewshot_lsr_predictions(x.astype(np.float32), y, x_test.astype(np.float32), 4)
    from_torch = fewshot_lsr_predictions(torch.tensor(x, dtype=torch.float32), torch.tensor(y),
                                         torch.tensor(x_test, dtype=torch.float32), 4)
    np.testing.assert_array_equal(from_numpy, from_torch)
    assert fewshot_lsr_accuracy(x, y, x_test, y_test, 4) == fewshot_lsr_accuracy(
        torch.tensor(x), torch.tensor(y), torch.tensor(x_test), torch.tensor(y_test), 4)


def test_separable_data_is_classified_perfectly():
    rng = np.random.default_rng(1)
    y, y_test = np.repeat(np.arange(3), 5), np.repeat(np.arange(3), 50)
    centres = 10.0 * np.eye(3)  # every feature carries class information
    x = centres[y] + 0.1 * rng.normal(size=(15, 3))
    x_test = centres[y_test] + 0.1 * rng.normal(size=(150, 3))
    assert fewshot_lsr_accuracy(x, y, x_test, y_test, 3) == 1.0


def test_shots_are_drawn_per_class_and_nested_as_in_big_vision():
    labels = np.repeat(np.arange(4), 30)
    drawn = sample_shots(labels, [1, 5, 10], seed=2, num_classes=4)
    for n, idx in drawn.items():
        np.testing.assert_array_equal(np.bincount(labels[idx], minlength=4), [n] * 4)
    assert set(drawn[5]) <= set(drawn[10])  # one permutation per class and seed
    rng = np.random.default_rng(2)  # the same draw, written out as big_vision does it
    first = [rng.permutation(np.flatnonzero(labels == c))[:5] for c in range(4)]
    np.testing.assert_array_equal(drawn[5], np.concatenate(first))


def test_too_many_shots_name_the_class_and_the_largest_possible_count():
    labels = np.array([0] * 10 + [1] * 3 + [2] * 8)
    with pytest.raises(InputError) as error:
        sample_shots(labels, [1, 5], seed=0, num_classes=3, class_names=["a", "b", "c"])
    says(error.value, "'b'", "3 images", "--shots 3")
    largest = int(str(error.value).split("--shots ")[1].split(";")[0])
    drawn = sample_shots(labels, [1, largest], seed=0, num_classes=3)  # the advice works
    assert len(drawn[largest]) == 3 * largest


# -- the CLI end to end on the embedded digits ------------------------------------------------
def test_fewshot_cli_on_digits_writes_table_json_and_figure(digits_run, tmp_path, capsys, caplog):
    report = tmp_path / "fewshot.json"
    with caplog.at_level(logging.INFO, logger="vitkit.evaluation"):
        assert main(["fewshot", str(digits_run), "--shots", "1,5,10", "--seeds", "2", "--json",
                     str(report), "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "pooled representation after the final norm" in printed
    assert "extracted" in caplog.text and "from the cache" not in caplog.text
    result = json.loads(report.read_text())
    assert result["shots"] == [1, 5, 10] and result["l2_reg"] == 1024.0
    assert result["train_images"] + result["test_images"] == 1797  # the digits, all of them
    accuracy = {int(n): v["mean"] for n, v in result["accuracy"].items()}
    assert accuracy[10] > accuracy[1] > 0.1  # better than chance, better with more shots
    assert all(len(v["per_seed"]) == 2 for v in result["accuracy"].values())
    assert f"{100 * accuracy[10]:.2f}" in printed
    assert (tmp_path / "fewshot.png").stat().st_size > 0
    caplog.clear()  # the second command reads the features extracted by the first
    with caplog.at_level(logging.INFO, logger="vitkit.evaluation"):
        assert main(["fewshot", str(digits_run), "--shots", "1,5,10", "--seeds", "2", "--json",
                     str(tmp_path / "again.json"), "--out", str(tmp_path)]) == 0
    assert "read from the cache" in caplog.text and "extracted" not in caplog.text
    assert json.loads((tmp_path / "again.json").read_text())["accuracy"] == result["accuracy"]


def test_fewshot_of_features_only_weights(digits_run, tmp_path, capsys):
    """Weights without a head (num_classes=0) give features all the same."""
    model = load_pretrained(digits_run)
    model.reset_classifier(0)
    save_pretrained(model, tmp_path / "backbone")
    assert main(["fewshot", str(tmp_path / "backbone"), "--data", "digits", "--shots", "1,5",
                 "--seeds", "1", "--out", str(tmp_path)]) == 0
    assert "5  " in capsys.readouterr().out


def test_too_many_shots_on_the_cli_says_the_largest_and_that_works(digits_run, tmp_path, capsys):
    assert main(["fewshot", str(digits_run), "--shots", "1,500", "--out", str(tmp_path)]) == 2
    message = capsys.readouterr().err
    says(message, "shots per class", "training split", "--shots ")
    largest = message.split("--shots ")[1].split(";")[0]
    assert main(["fewshot", str(digits_run), "--shots", largest, "--seeds", "1",
                 "--out", str(tmp_path)]) == 0


def test_fewshot_compares_several_weights_on_one_figure(digits_run, tmp_path, capsys):
    """A run and its own backbone (head removed) have the same features, so the same curve."""
    model = load_pretrained(digits_run)
    model.reset_classifier(0)
    save_pretrained(model, tmp_path / "backbone")
    report = tmp_path / "both.json"
    assert main(["fewshot", str(digits_run), str(tmp_path / "backbone"), "--data", "digits",
                 "--shots", "1,5", "--seeds", "2", "--json", str(report),
                 "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"== {digits_run}" in printed and "== side by side" in printed
    models = json.loads(report.read_text())["models"]
    assert [m["weights"] for m in models] == [str(digits_run), str(tmp_path / "backbone")]
    assert models[0]["accuracy"] == models[1]["accuracy"]
    mean = 100 * models[0]["accuracy"]["5"]["mean"]
    assert printed.count(f"{mean:.2f} ± ") == 2  # both columns of the side-by-side table
    assert (tmp_path / "fewshot.png").stat().st_size > 0


def test_a_class_without_training_images_draws_none_and_is_never_the_advice():
    """A class without training images (labels 1..3, or a class only the test split has)
    draws none, as big_vision's empty permutation does; too many shots are refused naming
    the smallest class that has images, never "--shots 0", and the curve runs."""
    labels = np.array([1] * 6 + [2] * 4 + [3] * 5)
    drawn = sample_shots(labels, [1, 4], seed=0, num_classes=4)
    np.testing.assert_array_equal(np.bincount(labels[drawn[4]], minlength=4), [0, 4, 4, 4])
    with pytest.raises(InputError) as error:
        sample_shots(labels, [5], seed=0, num_classes=4)
    says(error.value, "'class 2'", "4 images", "--shots 4")
    assert "--shots 0" not in str(error.value)
    assert len(sample_shots(labels, [4], seed=0, num_classes=4)[4]) == 12  # the advice works
    centres = np.random.default_rng(0).normal(size=(4, 6))
    x = centres[labels] + 0.1 * np.random.default_rng(1).normal(size=(len(labels), 6))
    result = fewshot_curve(x, labels, x, labels, 4, shots=[1, 4], seeds=2)
    assert result.mean(4) == 1.0  # separable: every image right, class 0 never predicted


@pytest.mark.parametrize(("change", "error", "message"), [
    ("nan_test", InputError, ("1 of the 40 feature rows", "inf or NaN", "row 3")),
    ("inf_train", InputError, ("1 of the 60 feature rows", "inf or NaN")),
    ("label_too_large", InputError, ("label is 7", "num_classes is 3", "num_classes=8")),
    ("fewer_labels", InputError, ("40 test features", "39 test labels")),
    ("other_width", InputError, ("6 dims", "test features 5")),
    ("fractional_label", InputError, ("whole class indices", "1.7")),
])
def test_the_frozen_feature_protocols_refuse_bad_arrays_by_name(change, error, message):
    """NaN or inf features, labels above num_classes, arrays of other lengths or widths and
    fractional labels are each refused by name, by the few-shot solve, the kNN and the
    linear probe alike; a label above num_classes names the num_classes that takes it."""
    from vitkit.evaluation import knn_accuracy, linear_probe

    x_train, y_train, x_test, y_test = _problem(60, 6, 3, seed=1)
    x_test, y_test = x_test[:40].copy(), y_test[:40].astype(np.float64)
    if change == "nan_test":
        x_test[3, 1] = np.nan
    elif change == "inf_train":
        x_train[5, 0] = np.inf
    elif change == "label_too_large":
        y_test[0] = 7
    elif change == "fewer_labels":
        y_test = y_test[:-1]
    elif change == "other_width":
        x_test = x_test[:, :5]
    else:
        y_test[2] = 1.7
    for protocol in (fewshot_lsr_accuracy, knn_accuracy, linear_probe):
        with pytest.raises(error) as refused:
            protocol(x_train, y_train, x_test, y_test, 3)
        says(refused.value, *message)
        if change == "label_too_large":  # the advice, followed
            protocol(x_train, y_train, x_test, y_test, 8)


def test_knn_k_below_one_and_no_seeds_are_refused():
    from vitkit.errors import ConfigError
    from vitkit.evaluation import knn_accuracy

    x, y, _, _ = _problem(30, 4, 3)
    with pytest.raises(ConfigError, match="k >= 1"):
        knn_accuracy(x, y, x, y, 3, k=0)  # no neighbours to vote
    with pytest.raises(ConfigError, match="at least one seed"):
        fewshot_curve(x, y, x, y, 3, shots=[1], seeds=0)  # no mean to take


def test_features_that_overflow_are_refused_by_fewshot_and_probe(digits_run, tmp_path, capsys):
    """Weights whose features overflow to inf (every weight finite) are refused by `fewshot`
    and `probe` as a clean error (exit 2), naming the images, before any protocol runs."""
    model = load_pretrained(digits_run)
    with torch.no_grad():
        model.blocks[-1].mlp.fc2.weight.mul_(1e38)
    save_pretrained(model, tmp_path / "overflow")
    for verb in (["fewshot", "--shots", "1", "--out", str(tmp_path)], ["probe"]):
        assert main([verb[0], str(tmp_path / "overflow"), "--data", "digits", *verb[1:]]) == 2
        err = capsys.readouterr().err
        says(err, "not finite", "inf or NaN", "train images of digits")


def test_fewshot_of_a_regression_model_is_refused_before_reading_images(tmp_path, capsys,
                                                                         monkeypatch):
    """`fewshot` of a regression model is refused (fewshot draws per class: use probe)
    before any image is read."""
    import vitkit.evaluation.features as features
    from vitkit import create_model
    from vitkit.tasks import TaskSpec

    model = create_model("Ti/8", img_size=8, in_chans=1, depth=1, num_classes=1)
    model.task = TaskSpec("regression")
    save_pretrained(model, tmp_path / "regressor")
    monkeypatch.setattr(features, "split_to_evaluate",
                        lambda *a, **k: pytest.fail("images read before the task check"))
    assert main(["fewshot", str(tmp_path / "regressor"), "--data", "digits",
                 "--out", str(tmp_path)]) == 2
    says(capsys.readouterr().err, "fewshot draws images per class", "probe")

