"""The linear probe equals scikit-learn's logistic regression, the kNN equals a brute-force
loop over DINO's rule, and `vitkit probe` runs end to end on cached frozen features (the
cache is read again only while the data is unchanged).

Mapping: our loss is mean cross-entropy + (wd / 2) ||W||^2; scikit-learn minimises
C * sum of cross-entropies + ||W||^2 / 2, the same objective times C * N when C = 1 / (wd * N).
Tolerances: identical predictions; coefficients within 1e-4 of the largest (both solvers stop
at a gradient tolerance, not at the exact optimum).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from sklearn.linear_model import LogisticRegression

from vitkit.catalog import create_model
from vitkit.cli import main
from vitkit.data.sources import open_source
from vitkit.errors import DataError
from vitkit.evaluation import fit_logistic, frozen_features, knn_predictions, linear_probe
from vitkit.evaluation.feature_arrays import standardize
from vitkit.evaluation.probe import stratified_holdout
from vitkit.preprocess import Preprocess
from vitkit.weights import save_pretrained


def _problem(n: int = 300, d: int = 12, classes: int = 4, seed: int = 0):
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(classes, d))
    y, y_test = np.arange(n) % classes, rng.integers(0, classes, 200)
    x = centres[y] + 1.2 * rng.normal(size=(n, d))
    x_test = centres[y_test] + 1.2 * rng.normal(size=(200, d))
    return x, y, x_test, y_test


def brute_force_knn(train, labels, test, num_classes, k, temperature):
    """DINO's weighted vote, one test image at a time."""
    train = train / np.linalg.norm(train, axis=1, keepdims=True)
    predictions = []
    for query in test:
        similarity = train @ (query / np.linalg.norm(query))
        votes = np.zeros(num_classes)
        for j in np.argsort(-similarity)[:k]:
            votes[labels[j]] += np.exp(similarity[j] / temperature)
        predictions.append(int(np.argmax(votes)))
    return np.array(predictions)


@pytest.mark.parametrize(("k", "temperature"), [(20, 0.07), (5, 1.0), (1, 0.07)])
def test_knn_equals_a_brute_force_loop(k, temperature):
    x, y, x_test, _ = _problem()
    expected = brute_force_knn(x, y, x_test, 4, k, temperature)
    np.testing.assert_array_equal(knn_predictions(x, y, x_test, 4, k, temperature, chunk=64),
                                  expected)


@pytest.mark.parametrize("weight_decay", [1e-3, 1e-1])
def test_logistic_probe_equals_scikit_learn(weight_decay):
    x, y, x_test, _ = _problem()
    x, x_test = standardize(x, x_test)
    ours = fit_logistic(x, y, 4, weight_decay)
    reference = LogisticRegression(C=1.0 / (weight_decay * len(x)), tol=1e-10,
                                   max_iter=10_000).fit(x, y)
    np.testing.assert_array_equal(ours.predict(x_test), reference.predict(x_test))
    scale = np.abs(reference.coef_).max()
    assert np.abs(ours.weight.T - reference.coef_).max() <= 1e-4 * scale
    # the softmax is unchanged by a shift of every bias: compare them centred
    centred = ours.bias - ours.bias.mean()
    assert np.abs(centred - (reference.intercept_ - reference.intercept_.mean())).max() <= 1e-4


def test_probe_picks_the_best_held_out_decay_and_scores_its_refit():
    x, y, x_test, y_test = _problem()
    grid = (1e-4, 1e-2, 1.0)
    result = linear_probe(x, y, x_test, y_test, 4, grid)
    assert result.heldout_accuracy[result.weight_decay] == max(result.heldout_accuracy.values())
    x_all, x_eval = standardize(x, x_test)
    refit = LogisticRegression(C=1.0 / (result.weight_decay * len(x)), tol=1e-10,
                               max_iter=10_000).fit(x_all, y)
    assert result.accuracy == pytest.approx(np.mean(refit.predict(x_eval) == y_test), abs=1e-12)


def test_held_out_split_is_a_seeded_tenth_of_every_class():
    labels = np.repeat(np.arange(3), [50, 20, 7])
    fit, held = stratified_holdout(labels, 0.1, seed=3)
    np.testing.assert_array_equal(np.bincount(labels[held]), [5, 2, 1])
    assert set(fit).isdisjoint(held) and len(fit) + len(held) == len(labels)
    np.testing.assert_array_equal(held, stratified_holdout(labels, 0.1, seed=3)[1])


# -- the CLI end to end on the embedded digits ------------------------------------------------
def test_probe_cli_on_digits_reuses_the_features_of_fewshot(digits_run, tmp_path, capsys, caplog):
    assert main(["fewshot", str(digits_run), "--shots", "1", "--seeds", "1",
                 "--out", str(tmp_path)]) == 0
    capsys.readouterr()
    report = tmp_path / "probe.json"
    with caplog.at_level(logging.INFO, logger="vitkit.evaluation"):
        assert main(["probe", str(digits_run), "--json", str(report)]) == 0
    assert "read from the cache" in caplog.text
    printed = capsys.readouterr().out
    result = json.loads(report.read_text())
    probe, knn = result["linear_probe"], result["knn"]
    assert probe["accuracy"] > 0.5 and knn["accuracy"] > 0.5  # chance is 0.1
    assert (knn["k"], knn["temperature"]) == (20, 0.07)
    assert f"{100 * probe['accuracy']:.2f}%" in printed and f"{100 * knn['accuracy']:.2f}%" \
        in printed
    assert f"chosen weight decay {probe['weight_decay']:g}" in printed
    assert len(probe["heldout_accuracy"]) == 6


def test_images_of_another_size_are_resized_and_the_log_says_so(tmp_path, caplog):
    """Features-only weights (num_classes=0) of a 16x16 model on the 8x8 digits: the images
    are resized as fine-tuning does, and the log says so."""
    model = create_model("Ti/4", img_size=16, in_chans=1, num_classes=0, width=32, depth=1,
                         num_heads=2, mlp_dim=64)
    save_pretrained(model, tmp_path / "model16", Preprocess(img_size=16, mean=[0.5], std=[0.5]))
    with caplog.at_level(logging.INFO, logger="vitkit.evaluation"):
        features = frozen_features(tmp_path / "model16", "digits")
    for part in ("8x8", "16x16", "resizing"):
        assert part in caplog.text, caplog.text
    assert features.train_x.shape == (len(features.train_y), 32)
    reference = model.forward_head(model.forward_features(torch.nn.functional.interpolate(
        (torch.from_numpy(load_digits_first()) / 255.0 - 0.5) / 0.5, size=(16, 16),
        mode="bilinear", align_corners=False, antialias=True)), pre_logits=True)
    np.testing.assert_allclose(features.train_x[:1], reference.detach().numpy(), atol=1e-5)


def load_digits_first() -> np.ndarray:
    """The first training digit, uint8 (1, 1, 8, 8)."""
    train, _ = open_source("digits", channels=1)
    return train.images[:1].numpy()


def _png(path: Path, value: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.full((8, 8), value, np.uint8)).save(path)


def test_an_empty_split_is_a_clear_data_error(digits_run, tmp_path):
    root = tmp_path / "images"
    for label, value in (("a", 0), ("b", 255)):
        for i in range(3):
            _png(root / "train" / label / f"{i}.png", value)
    (root / "val" / "a").mkdir(parents=True)  # the held-out split has no images
    with pytest.raises(DataError) as error:
        frozen_features(digits_run, "folder", str(root))
    assert "no images" in str(error.value) or "empty" in str(error.value)
    for label, value in (("a", 0), ("b", 255)):  # the advice: give the split images
        _png(root / "val" / label / "0.png", value)
    assert len(frozen_features(digits_run, "folder", str(root)).test_y) == 2


@pytest.mark.parametrize("samples,expected", [(20, [1, "before"]), (20_000, [])])
def test_a_probe_fits_small_problems_on_one_thread_and_leaves_large_ones_alone(
        monkeypatch, samples, expected):
    """A small fit runs on one thread and restores the count; a large one never calls
    `torch.set_num_threads` (even the same count turns MKL's dynamic threading off)."""
    import vitkit.evaluation.probe as probe_module

    monkeypatch.setattr(probe_module, "SINGLE_THREAD_WORK", 10_000)
    before = torch.get_num_threads()
    calls = []
    monkeypatch.setattr(torch, "set_num_threads", calls.append)
    monkeypatch.setattr(torch, "get_num_threads", lambda: calls[-1] if calls else before)
    rng = np.random.default_rng(0)
    y = rng.integers(0, 2, samples)
    x = rng.normal(size=(samples, 2)) + y[:, None]
    probe = fit_logistic(x, y, 2, weight_decay=1e-3)
    assert (probe.predict(x) == y).mean() > 0.7
    assert calls == [before if item == "before" else item for item in expected] or \
        (before == 1 and calls == [])


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
