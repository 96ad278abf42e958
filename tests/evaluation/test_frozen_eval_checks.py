"""Frozen-feature evaluation checks: kNN temperature and few-shot l2 refused out of range,
a small kNN temperature tends to 1-nearest-neighbour, the linear probe warns when L-BFGS stops
at its cap, a kNN asked for more neighbours than there are training images says the k it
used, the report names the features (after which norm), and `vitkit eval` of arrays does not
read the training split's images."""

from __future__ import annotations

import logging

import numpy as np
import pytest

from vitkit import create_model
from vitkit.cli import main
from vitkit.errors import ConfigError
from vitkit.evaluation import evaluate_checkpoint, fewshot_curve, fit_logistic, knn_accuracy
from vitkit.evaluation import probe as probe_module
from vitkit.evaluation.feature_arrays import standardize
from vitkit.preprocess import Preprocess
from vitkit.weights import save_pretrained


def _features(n: int = 300, d: int = 16, classes: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, d))
    y, y_test = np.arange(n) % classes, rng.integers(0, classes, 200)
    x = centres[y] + 1.5 * rng.normal(size=(n, d))
    x_test = centres[y_test] + 1.5 * rng.normal(size=(200, d))
    return x, y, x_test, y_test


def _one_nn_accuracy(x, y, x_test, y_test) -> float:
    a = x / np.linalg.norm(x, axis=1, keepdims=True)
    b = x_test / np.linalg.norm(x_test, axis=1, keepdims=True)
    return float(np.mean(y[(b @ a.T).argmax(1)] == y_test))


@pytest.mark.parametrize("temperature", [1e-3, 1e-9])
def test_a_small_temperature_gives_one_nearest_neighbour(temperature):
    x, y, x_test, y_test = _features()
    one_nn = _one_nn_accuracy(x, y, x_test, y_test)
    assert knn_accuracy(x, y, x_test, y_test, 4, k=20, temperature=temperature) == one_nn


@pytest.mark.parametrize("temperature", [0.0, -0.07, float("nan"), float("inf")])
def test_knn_refuses_a_temperature_not_above_zero(temperature):
    x, y, x_test, y_test = _features()
    with pytest.raises(ConfigError, match="--temperature"):
        knn_accuracy(x, y, x_test, y_test, 4, temperature=temperature)


def test_fewshot_refuses_a_negative_l2():
    x, y, x_test, y_test = _features()
    with pytest.raises(ConfigError, match="--l2"):
        fewshot_curve(x, y, x_test, y_test, 4, (1, 5), 1, l2_reg=-1024.0)


@pytest.mark.parametrize(("argv", "flag"), [(["probe", "run", "--temperature", "0"],
                                             "--temperature"),
                                            (["probe", "run", "--temperature", "-0.07"],
                                             "--temperature"),
                                            (["fewshot", "run", "--l2", "-1024"], "--l2")])
def test_the_cli_refuses_the_flag_by_name(argv, flag, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert f"argument {flag}" in capsys.readouterr().err


def _low_rank_features(n: int = 300, d: int = 48, rank: int = 6, classes: int = 5):
    """Standardised features of rank 6 plus 2% noise: poorly conditioned, overlapping
    classes (objective ~1.24 at weight decay 1e-5), as a weakly trained model's are."""
    rng = np.random.default_rng(0)
    y = np.arange(n) % classes
    z = 0.3 * rng.normal(size=(classes, rank))[y] + rng.normal(size=(n, rank))
    x = z @ rng.normal(size=(rank, d)) + 0.02 * rng.normal(size=(n, d))
    return standardize(x, x[:1])[0], y


def _objective(x, y, weight, bias, weight_decay: float) -> float:
    z = x @ weight + bias
    z = z - z.max(1, keepdims=True)
    cross_entropy = np.log(np.exp(z).sum(1)) - z[np.arange(len(y)), y]
    return float(cross_entropy.mean() + 0.5 * weight_decay * (weight**2).sum())


def test_a_probe_needing_more_than_1000_iterations_reaches_scikit_learns_optimum():
    """scikit-learn (tol 1e-12) is the reference: a cap of 1000 iterations stops short of its
    objective on this problem (by how much depends on the CPU's L-BFGS path), and the default
    cap reaches it within 5e-8."""
    from sklearn.linear_model import LogisticRegression

    x, y = _low_rank_features()
    wd = 1e-5
    reference = LogisticRegression(C=1 / (wd * len(x)), max_iter=100000, tol=1e-12).fit(x, y)
    best = _objective(x, y, reference.coef_.T, reference.intercept_, wd)
    old = fit_logistic(x, y, 5, wd, max_iter=1000)
    probe = fit_logistic(x, y, 5, wd)
    assert old.iterations == 1000 and probe.iterations > 1000  # 1000 stops short

    assert _objective(x, y, old.weight, old.bias, wd) > best
    assert abs(_objective(x, y, probe.weight, probe.bias, wd) - best) < 5e-8


def test_a_probe_stopped_at_its_cap_warns_and_names_the_fix(caplog):
    x, y, _, _ = _features()
    with caplog.at_level(logging.WARNING, logger="vitkit.evaluation"):
        probe = fit_logistic(x, y, 4, 1e-5, max_iter=3)
    assert probe.iterations == 3
    assert "cap of 3 iterations" in caplog.text and "max_iter" in caplog.text


def test_a_converged_probe_does_not_warn(caplog):
    x, y, _, _ = _features()
    with caplog.at_level(logging.WARNING, logger="vitkit.evaluation"):
        probe = fit_logistic(x, y, 4, 1e-2)
    assert probe.iterations < probe_module.MAX_ITER
    assert "L-BFGS" not in caplog.text


def _arrays(n: int, seed: int, nan_at: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    y = rng.integers(0, 3, n)
    x = rng.normal(size=(n, 1, 8, 8)).astype(np.float32)
    x[:, 0] += y[:, None, None]
    if nan_at is not None:
        x[nan_at, 0, 3, 3] = np.nan
    return x, y


def test_eval_of_arrays_ignores_a_nan_in_the_training_split(tmp_path):
    data = tmp_path / "data"
    data.mkdir()
    xtr, ytr = _arrays(40, 0, nan_at=5)
    xte, yte = _arrays(20, 1)
    np.savez(data / "train.npz", images=xtr, targets=ytr)
    np.savez(data / "test.npz", images=xte, targets=yte)
    model = create_model("Ti/4", img_size=8, in_chans=1, num_classes=3, depth=1, width=16,
                         num_heads=2, mlp_dim=32)
    weights = tmp_path / "weights"
    save_pretrained(model, weights, preprocess=Preprocess(img_size=[8, 8], mean=[0.0],
                                                          std=[1.0], scale=1.0))
    result = evaluate_checkpoint(weights, data="arrays", data_dir=str(data),
                                 out=tmp_path / "eval")
    assert result.data["images"] == 20


@pytest.mark.parametrize("final_norm, words", [("none", "(the model has no final norm)"),
                                               ("tokens", "after the final norm"),
                                               ("pooled", "after the pooled norm")])
def test_the_feature_words_follow_the_final_norm(final_norm, words):
    from vitkit.evaluation.features import representation_of

    pool = "mean_patches" if final_norm == "pooled" else "class_token"
    model = create_model("Ti/16", img_size=32, depth=1, final_norm=final_norm, pool=pool)
    assert words in representation_of(model)


def test_knn_with_k_above_the_training_images_says_the_k_it_used(monkeypatch, caplog):
    from vitkit.evaluation import frozen_report
    from vitkit.evaluation.features import FrozenFeatures

    rng = np.random.default_rng(0)
    features = FrozenFeatures(rng.normal(size=(12, 4)).astype(np.float32),
                              np.arange(12) % 3, rng.normal(size=(6, 4)).astype(np.float32),
                              np.arange(6) % 3, ["a", "b", "c"], "pooled representation",
                              "synthetic")
    monkeypatch.setattr(frozen_report, "frozen_features", lambda *args: features)
    report = frozen_report.probe_report("weights", k=100000)
    assert "kNN (k=12, 100000 asked, T=0.07, cosine)" in report.text
    assert report.data["knn"]["k"] == 12 and report.data["knn"]["k_asked"] == 100000
    for part in ("k=100000", "12 training images"):
        assert part in caplog.text, caplog.text
