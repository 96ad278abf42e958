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
from pathlib import Path

import numpy as np
import pytest
import torch

from vitkit.catalog import load_pretrained
from vitkit.cli import main
from vitkit.errors import InputError
from vitkit.evaluation import fewshot_lsr_accuracy, fewshot_lsr_predictions, ridge_solver
from vitkit.evaluation.fewshot import sample_shots
from vitkit.train.config import load_train_config
from vitkit.train.loop import run_loop
from vitkit.train.setup import build_run
from vitkit.weights import save_pretrained

REL_TOL = 1e-8
# A tiny digits model: two epochs of a two-block ViT (seconds on a CPU).
RUN = ["epochs=2", "progress=false", "model.width=64", "model.num_heads=2", "model.mlp_dim=128",
       "model.depth=2", "model.patch_size=4"]


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
    with pytest.raises(InputError, match=r"'b' \(3 images\).*--shots 3") as error:
        sample_shots(labels, [1, 5], seed=0, num_classes=3, class_names=["a", "b", "c"])
    largest = int(str(error.value).split("--shots ")[1].split(";")[0])
    drawn = sample_shots(labels, [1, largest], seed=0, num_classes=3)  # the advice works
    assert len(drawn[largest]) == 3 * largest


# -- the CLI end to end on the embedded digits ------------------------------------------------
@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    run_loop(build_run(load_train_config("digits", [*RUN, f"out_dir={out}"])))
    return out


def test_fewshot_cli_on_digits_writes_table_json_and_figure(run, tmp_path, capsys, caplog):
    report = tmp_path / "fewshot.json"
    with caplog.at_level(logging.INFO, logger="vitkit.evaluation"):
        assert main(["fewshot", str(run), "--shots", "1,5,10", "--seeds", "2", "--json",
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
        assert main(["fewshot", str(run), "--shots", "1,5,10", "--seeds", "2", "--json",
                     str(tmp_path / "again.json"), "--out", str(tmp_path)]) == 0
    assert "read from the cache" in caplog.text and "extracted" not in caplog.text
    assert json.loads((tmp_path / "again.json").read_text())["accuracy"] == result["accuracy"]


def test_fewshot_of_features_only_weights(run, tmp_path, capsys):
    """Weights without a head (num_classes=0) give features all the same."""
    model = load_pretrained(run)
    model.reset_classifier(0)
    save_pretrained(model, tmp_path / "backbone")
    assert main(["fewshot", str(tmp_path / "backbone"), "--data", "digits", "--shots", "1,5",
                 "--seeds", "1", "--out", str(tmp_path)]) == 0
    assert "5  " in capsys.readouterr().out


def test_too_many_shots_on_the_cli_says_the_largest_and_that_works(run, tmp_path, capsys):
    assert main(["fewshot", str(run), "--shots", "1,500", "--out", str(tmp_path)]) == 2
    message = capsys.readouterr().err
    assert "shots per class is more than the training split holds" in message
    largest = message.split("--shots ")[1].split(";")[0]
    assert main(["fewshot", str(run), "--shots", largest, "--seeds", "1",
                 "--out", str(tmp_path)]) == 0


def test_fewshot_compares_several_weights_on_one_figure(run, tmp_path, capsys):
    """A run and its own backbone (head removed) have the same features, so the same curve."""
    model = load_pretrained(run)
    model.reset_classifier(0)
    save_pretrained(model, tmp_path / "backbone")
    report = tmp_path / "both.json"
    assert main(["fewshot", str(run), str(tmp_path / "backbone"), "--data", "digits",
                 "--shots", "1,5", "--seeds", "2", "--json", str(report),
                 "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert f"== {run}" in printed and "== side by side" in printed
    models = json.loads(report.read_text())["models"]
    assert [m["weights"] for m in models] == [str(run), str(tmp_path / "backbone")]
    assert models[0]["accuracy"] == models[1]["accuracy"]
    mean = 100 * models[0]["accuracy"]["5"]["mean"]
    assert printed.count(f"{mean:.2f} ± ") == 2  # both columns of the side-by-side table
    assert (tmp_path / "fewshot.png").stat().st_size > 0
