"""The task owner (`vitkit.tasks`): metrics equal scikit-learn's, targets and losses per task,
standardisation round trips, and the errors for targets that do not fit a task."""

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

from vitkit.errors import ConfigError, DataError
from vitkit.tasks import LOSS_MEANINGS, LOSSES, TaskSpec, infer_task, make_task
from vitkit.train.config import check_task


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"


def test_regression_metrics_equal_scikit_learn() -> None:
    rng = np.random.default_rng(0)
    true = rng.normal(3.0, 2.0, size=(200, 3))
    pred = true + rng.normal(0, 0.7, size=true.shape)
    spec = infer_task(true.astype(np.float32), names=["a", "b", "c"])
    task = make_task(spec)
    mean, std = np.array(spec.target_mean), np.array(spec.target_std)
    outputs = torch.tensor((pred - mean) / std, dtype=torch.float32)  # what the head predicts
    got = task.metrics(outputs, torch.tensor(true, dtype=torch.float32))
    assert got["r2"] == pytest.approx(r2_score(true, pred), abs=1e-5)
    assert got["mae"] == pytest.approx(mean_absolute_error(true, pred), abs=1e-5)
    assert got["rmse"] == pytest.approx(root_mean_squared_error(true, pred), abs=1e-5)
    per = r2_score(true, pred, multioutput="raw_values")
    assert [got["per_output"][n]["r2"] for n in "abc"] == pytest.approx(per, abs=1e-5)


def test_standardisation_round_trips() -> None:
    true = torch.tensor([[1.0], [5.0], [9.0]])
    task = make_task(infer_task(true))
    standard = task.training_targets(true, 1)
    assert standard.mean().item() == pytest.approx(0.0, abs=1e-6)
    torch.testing.assert_close(task.decode(standard), true)


def test_multilabel_metrics_equal_scikit_learn_with_ties_and_an_empty_label() -> None:
    rng = np.random.default_rng(1)
    truth = (rng.random((150, 4)) < 0.3).astype(np.float32)
    truth[:, 3] = 0  # no positives: scikit-learn scores it 0 (and warns)
    logits = rng.normal(size=truth.shape).round(1) + 1.5 * truth  # rounded: tied scores
    task = make_task(infer_task(truth, "multilabel"))
    got = task.metrics(torch.tensor(logits, dtype=torch.float32), torch.tensor(truth))
    probs = 1 / (1 + np.exp(-logits))
    with np.errstate(all="ignore"), pytest.warns(UserWarning):
        expected_map = average_precision_score(truth, probs, average="macro")
    assert got["map"] == pytest.approx(expected_map, abs=1e-6)
    expected_f1 = f1_score(truth, probs >= 0.5, average="macro", zero_division=0)
    assert got["f1"] == pytest.approx(expected_f1, abs=1e-6)


def test_targets_choose_the_task() -> None:
    assert infer_task(np.array([0, 2, 1])).kind == "classification"
    assert infer_task(np.array([0.5, 2.0])).kind == "regression"
    assert infer_task(np.array([[0.5, 2.0]])).kind == "regression"
    assert infer_task(np.array([[0, 1], [1, 1]]), "multilabel").kind == "multilabel"


def test_targets_that_do_not_fit_are_refused_by_name() -> None:
    with pytest.raises(DataError) as refused:
        infer_task(np.array([0.1, 0.2, np.nan]))
    says(refused.value, "NaN or inf", "index 2")
    with pytest.raises(DataError) as refused:
        infer_task(np.array([[0.5, 2.0]]), "multilabel")
    says(refused.value, "task=multilabel", "0 and 1")
    with pytest.raises(DataError) as refused:
        infer_task(np.array([0.5, 2.0]), "classification")
    says(refused.value, "task=classification", "integer class indices", "task=regression")
    assert infer_task(np.array([0.5, 2.0]), "regression").kind == "regression"  # as advised
    with pytest.raises(ConfigError) as refused:
        infer_task(np.array([0, 1]), loss="huber")
    says(refused.value, "loss='huber'", "task=classification", "cross_entropy")
    assert infer_task(np.array([0, 1]), loss="cross_entropy").kind == "classification"
    with pytest.raises(ConfigError) as refused:
        make_task(TaskSpec("regression")).training_targets(torch.zeros(2, 1), 1, 0.1)
    says(refused.value, "label_smoothing", "classification", "drop label_smoothing")


@pytest.mark.parametrize("given, meant", [
    ("mae", "l1"), ("mean_absolute_error", "l1"), ("mean_squared_error", "mse"),
    ("smooth_l1", "huber"), ("SmoothL1Loss", "huber"), ("ce", "cross_entropy"),
    ("crossentropy", "cross_entropy"), ("softmax", "cross_entropy"),
    ("bce_with_logits", "bce"), ("BCEWithLogitsLoss", "bce"), ("binary_cross_entropy", "bce")])
def test_a_common_name_of_a_loss_is_suggested_as_that_loss_not_accepted(given, meant) -> None:
    with pytest.raises(ConfigError) as refused:
        check_task(None, given)
    says(refused.value, f"loss={given!r}", f"Did you mean {meant!r}", LOSS_MEANINGS[meant])
    kind = next(kind for kind, names in LOSSES.items() if meant in names)
    check_task(kind, meant)  # the suggestion is accepted
    other = next(other for other in LOSSES if other != kind)  # a task that does not take it
    with pytest.raises(ConfigError) as refused:
        check_task(other, given)
    says(refused.value, f"{given!r} is {meant!r}", f"task={kind}")


def test_a_loss_of_another_task_names_that_task_and_a_bad_saved_loss_is_a_config_error(
        ) -> None:
    with pytest.raises(ConfigError) as refused:
        check_task("classification", "mse")
    says(refused.value, "'mse'", "mean squared error", "task=regression")
    with pytest.raises(ConfigError) as refused:
        TaskSpec("regression", loss="bce")
    says(refused.value, "'bce'", "binary cross-entropy", "task=multilabel", "mse, huber, l1")
    with pytest.raises(ConfigError) as refused:
        TaskSpec.from_dict({"kind": "regression", "loss": 1})  # as a config.json may hold
    says(refused.value, "loss=1", "task=regression", "mse, huber, l1")


def test_huber_is_smooth_l1_as_its_suggestion_says() -> None:
    """vitkit's huber (F.huber_loss, delta 1) equals torch's smooth L1 at its default beta 1,
    as the suggestion for loss=smooth_l1 says."""
    outputs, targets = torch.randn(64, 3) * 3, torch.randn(64, 3)
    spec = TaskSpec("regression", loss="huber", target_mean=[0.0] * 3, target_std=[1.0] * 3)
    assert torch.allclose(make_task(spec).loss(outputs, targets),
                          torch.nn.SmoothL1Loss()(outputs, targets))


def test_spec_round_trips_through_a_dict() -> None:
    spec = infer_task(np.array([[1.0, 2.0], [3.0, 5.0]]), names=["x", "y"], loss="huber")
    assert TaskSpec.from_dict(spec.to_dict()) == spec


@pytest.mark.parametrize("kind", ["multilabel", "regression"])
def test_repeated_output_names_are_refused_where_outputs_are_keyed_by_name(kind):
    """Output names that repeat are refused for tasks whose outputs are keyed by name (one
    output would hide the other), naming the name; a class list may repeat."""
    from vitkit.errors import ConfigError
    from vitkit.tasks import TaskSpec

    with pytest.raises(ConfigError) as refused:
        TaskSpec(kind, names=["cat", "cat", "dog"])
    says(refused.value, "output names", kind, "repeat", "('cat')", "a name of its own")
    assert TaskSpec(kind, names=["cat", "cat 2", "dog"]).names == ["cat", "cat 2", "dog"]
    assert TaskSpec("classification", names=["cat", "cat"]).names == ["cat", "cat"]  # a list


def test_a_file_written_with_repeated_output_names_loads_with_them_told_apart(tmp_path, caplog):
    """A saved folder whose output names repeat still loads, with a warning: each repeated
    name gets its output's number, so no output is lost."""
    import json
    import logging

    import vitkit
    from vitkit.tasks import TaskSpec

    model = vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=3)
    model.task = TaskSpec("multilabel", names=["cat", "cow", "dog"])
    folder = vitkit.save_pretrained(model, tmp_path / "old")
    meta = json.loads((folder / "config.json").read_text())
    meta["task"]["names"] = ["cat", "cat", "dog"]
    (folder / "config.json").write_text(json.dumps(meta))
    with caplog.at_level(logging.WARNING):
        loaded = vitkit.load_pretrained(folder)
    assert loaded.task.names == ["cat (output 1)", "cat (output 2)", "dog"]
    says(caplog.text, "output names repeat", "('cat')")

    probs = make_task(loaded.task).describe(torch.zeros(1, 3))[0]["probs"]
    assert list(probs) == ["cat (output 1)", "cat (output 2)", "dog"]  # three, none lost
