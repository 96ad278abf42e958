"""predict, explain, export and probe speak the task: regression values (de-standardised)
under the target names, multi-label probabilities and labels, array files as inputs; each
checked against an independent computation (a plain forward, onnxruntime, scikit-learn)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitkit import create_model, save_pretrained
from vitkit.cli import main
from vitkit.preprocess import Preprocess
from vitkit.tasks import TaskSpec

TINY = {"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "patch_size": 4,
        "img_size": [16, 16], "init": "trunc_normal"}
NAMES = ["temperature", "pressure"]
MEAN, STD = [3.0, -1.0], [2.0, 0.5]
LABELS = ["cat", "dog", "sky"]


def _randomise_head(model: torch.nn.Module) -> torch.nn.Module:
    torch.manual_seed(0)
    torch.nn.init.normal_(model.head.weight, std=2.0)
    torch.nn.init.normal_(model.head.bias, std=1.0)
    return model.eval()


def regression_model() -> torch.nn.Module:
    model = create_model({**TINY, "in_chans": 1, "num_classes": 2})
    model.task = TaskSpec("regression", names=NAMES, target_mean=MEAN, target_std=STD)
    model.preprocess = Preprocess(img_size=(16, 16), scale=1.0, mean=(0.5,), std=(0.25,))
    return _randomise_head(model)


def multilabel_model() -> torch.nn.Module:
    model = create_model({**TINY, "in_chans": 1, "num_classes": 3})
    model.task = TaskSpec("multilabel", names=LABELS)
    model.preprocess = Preprocess(img_size=(16, 16), scale=1.0, mean=(0.5,), std=(0.25,))
    return _randomise_head(model)


def picture_model() -> torch.nn.Module:
    """A classifier trained on 8-bit pictures (scale 255)."""
    model = create_model({**TINY, "in_chans": 1, "num_classes": 3})
    model.preprocess = Preprocess(img_size=(16, 16), mean=(0.5,), std=(0.5,))
    return model.eval()


def fields(count: int, size: tuple[int, int] = (16, 16), seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).random((count, *size)).astype(np.float32)


def destandardised(model: torch.nn.Module, images: np.ndarray) -> np.ndarray:
    """The independent reference: normalise by hand, plain forward, output * std + mean."""
    x = (torch.from_numpy(images).float().reshape(len(images), 1, 16, 16) - 0.5) / 0.25
    with torch.no_grad():
        out = model(x)
    return (out * torch.tensor(STD) + torch.tensor(MEAN)).numpy()


# -- predict ------------------------------------------------------------------------------------
def test_predict_regression_values_are_the_destandardised_outputs(tmp_path):
    from vitkit.predict import predict

    model = regression_model()
    batch, single = fields(3), fields(1, seed=1)[0]
    np.save(tmp_path / "batch.npy", batch)  # (N, H, W)
    np.save(tmp_path / "one.npy", single)  # (H, W)
    np.savez(tmp_path / "set.npz", images=batch[:2, None], targets=np.zeros(2))  # (N, C, H, W)
    rows = predict(model, [tmp_path / "batch.npy", tmp_path / "one.npy", tmp_path / "set.npz"],
                   batch_size=4)
    assert [row.path for row in rows] == [
        *(f"{tmp_path / 'batch.npy'}[{i}]" for i in range(3)), f"{tmp_path / 'one.npy'}[0]",
        f"{tmp_path / 'set.npz'}[0]", f"{tmp_path / 'set.npz'}[1]"]
    expected = destandardised(model, np.concatenate([batch, single[None], batch[:2]]))
    got = np.array([row.to_dict()["values"] for row in rows])
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert rows[0].to_dict()["names"] == NAMES
    assert rows[0].format() == (f"{rows[0].path}: temperature={expected[0, 0]:.4g}, "
                                f"pressure={expected[0, 1]:.4g}")


def test_predict_resizes_arrays_of_another_size_to_the_models(tmp_path):
    from vitkit.predict import predict

    model = regression_model()
    big = fields(2, (24, 20))
    np.save(tmp_path / "big.npy", big)
    rows = predict(model, [tmp_path / "big.npy"])
    resized = F.interpolate(torch.from_numpy(big)[:, None], size=(16, 16), mode="bilinear",
                            align_corners=False, antialias=True)
    expected = destandardised(model, resized.numpy())
    np.testing.assert_allclose([row.report["values"] for row in rows], expected, atol=1e-5)


def test_predict_channels_last_array_equals_channels_first(tmp_path):
    from vitkit.predict import predict

    model = create_model({**TINY, "in_chans": 3, "num_classes": 1})
    model.task = TaskSpec("regression")
    model.preprocess = Preprocess(img_size=(16, 16), scale=1.0)
    images = np.random.default_rng(0).random((2, 3, 16, 16)).astype(np.float32)
    np.save(tmp_path / "first.npy", images)
    np.save(tmp_path / "last.npy", images.transpose(0, 2, 3, 1))
    first, last = (predict(model, [tmp_path / f"{n}.npy"]) for n in ("first", "last"))
    assert [r.report["values"] for r in first] == [r.report["values"] for r in last]
    assert first[0].format().endswith(f"value={first[0].report['values'][0]:.4g}")


def test_predict_multilabel_reports_labels_at_half_and_every_probability(tmp_path):
    from vitkit.predict import predict

    model = multilabel_model()
    images = fields(4)
    np.save(tmp_path / "x.npy", images)
    rows = predict(model, [tmp_path / "x.npy"])
    x = (torch.from_numpy(images)[:, None] - 0.5) / 0.25
    with torch.no_grad():
        probs = torch.sigmoid(model(x)).numpy()
    for row, p in zip(rows, probs, strict=True):
        report = row.to_dict()
        assert list(report["probs"]) == LABELS
        np.testing.assert_allclose(list(report["probs"].values()), p, rtol=1e-5)
        assert report["labels"] == [name for name, q in zip(LABELS, p, strict=True) if q >= 0.5]
    assert any(row.report["labels"] for row in rows)  # the test sees labels predicted
    shown = rows[0].format()
    assert shown.startswith(f"{rows[0].path}: ")
    for label in rows[0].report["labels"]:
        assert f"{label} ({100 * rows[0].report['probs'][label]:.2f}%)" in shown


def test_prediction_format_of_each_task():
    from vitkit.predict import Prediction

    values = Prediction("f.npy[0]", task="regression", names=["temperature"],
                        report={"values": [3.21449]})
    assert values.format() == "f.npy[0]: temperature=3.214"
    assert values.to_dict() == {"path": "f.npy[0]", "values": [3.21449],
                                "names": ["temperature"]}
    none = Prediction("p.png", task="multilabel",
                      report={"probs": {"cat": 0.25, "dog": 0.4}, "labels": []})
    assert none.format() == "p.png: no label at 50% or more (highest: dog 40.00%)"
    assert none.to_dict() == {"path": "p.png", "probs": {"cat": 0.25, "dog": 0.4},
                              "labels": []}


@pytest.mark.parametrize("make, parts", [
    (lambda d: np.savez(d / "a.npz", fields=fields(2), targets=np.zeros(2)),
     ("'images'", "fields", "targets")),
    (lambda d: np.save(d / "a.npy", np.zeros((1, 1, 1, 16, 16), np.float32)),
     ("5 dimensions", "(N, C, H, W)")),
    (lambda d: np.save(d / "a.npy", np.zeros((2, 3, 16, 16), np.float32)),
     ("(2, 3, 16, 16)", "1 channel", "(N, 1, H, W)")),
])
def test_bad_array_files_are_reported_by_name(tmp_path, make, parts):
    """An array file that does not fit is reported on its row, naming the file, what is wrong
    and the shape to give."""
    from vitkit.predict import predict

    make(tmp_path)
    path = next(tmp_path.iterdir())
    row, = predict(regression_model(), [path])
    assert row.error is not None
    for part in (str(path), *parts):
        assert part in row.error, row.error


def test_a_float_array_given_to_a_picture_model_is_refused_and_uint8_as_advised_works(
        tmp_path):
    from vitkit.predict import predict

    model = picture_model()
    np.save(tmp_path / "float.npy", fields(2))
    row = predict(model, [tmp_path / "float.npy"])[0]
    for part in ("float.npy", "8-bit pictures", "uint8"):
        assert part in row.error, row.error
    # the fix the message gives
    a = fields(2)
    np.save(tmp_path / "bytes.npy", (a * 255).round().clip(0, 255).astype(np.uint8))
    rows = predict(model, [tmp_path / "bytes.npy"], topk=1)
    assert all(row.ok for row in rows) and len(rows) == 2
    x = torch.from_numpy((a * 255).round().clip(0, 255).astype(np.uint8))[:, None]
    with torch.no_grad():
        expected = model((x.float() / 255 - 0.5) / 0.5).argmax(1).tolist()
    assert [row.indices[0] for row in rows] == expected


def test_cli_says_why_when_no_array_could_be_read(tmp_path, capsys):
    folder = save_pretrained(picture_model(), tmp_path / "pictures")
    np.save(tmp_path / "float.npy", fields(1))
    assert main(["predict", str(folder), str(tmp_path / "float.npy")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitkit predict: error: ") and "Traceback" not in err
    for part in ("none of the 1", "could be read", "8-bit pictures", "uint8"):
        assert part in err, err


def test_cli_predict_json_regression_on_a_saved_model(tmp_path, capsys):
    """A saved regression model keeps its task (save_pretrained/load_pretrained carry
    model.task): predict --json gives its de-standardised values."""
    model = regression_model()
    folder = save_pretrained(model, tmp_path / "reg")
    images = fields(3)
    np.save(tmp_path / "x.npy", images)
    assert main(["predict", str(folder), str(tmp_path / "x.npy"), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    np.testing.assert_allclose([line["values"] for line in lines],
                               destandardised(model, images), rtol=1e-5, atol=1e-5)
    assert lines[0]["names"] == NAMES


# -- explain ------------------------------------------------------------------------------------
@pytest.mark.parametrize("make_model", [regression_model, multilabel_model])
def test_explain_reports_the_task_for_array_inputs(tmp_path, make_model):
    from vitkit.analysis.explain import explain
    from vitkit.analysis.inputs import images_from_files
    from vitkit.tasks import task_of

    model = make_model()
    np.save(tmp_path / "x.npy", fields(3))
    images, names = images_from_files([tmp_path / "x.npy"], model.preprocess)
    assert images.dtype == torch.float32 and names[2] == f"{tmp_path / 'x.npy'}[2]"
    report = explain(model, images, tmp_path / "out", names=names, show=2)
    assert report["task"] == task_of(model).kind
    with torch.no_grad():
        outputs = model((images - 0.5) / 0.25)
    expected = task_of(model).describe(outputs)
    if report["task"] == "regression":
        np.testing.assert_allclose([p["values"] for p in report["predictions"]],
                                   [e["values"] for e in expected], rtol=1e-5)
        assert " -> temperature=" in report["images"][0]
    else:
        assert [p["labels"] for p in report["predictions"]] == [e["labels"] for e in expected]
        assert report["images"][0].startswith(f"{names[0]} -> ")
    assert (tmp_path / "out" / "attention_rollout.png").stat().st_size > 0


def test_explain_samples_test_arrays_of_a_regression_run_named_by_their_targets(tmp_path):
    from vitkit.analysis.inputs import images_from_data
    from vitkit.tasks import task_of

    model = regression_model()
    data = tmp_path / "arrays"
    data.mkdir()
    for split, count in (("train", 4), ("test", 6)):
        images = fields(count, seed=count)
        targets = np.stack([images.mean((1, 2)), images.max((1, 2))], 1).astype(np.float32)
        np.savez(data / f"{split}.npz", images=images, targets=targets)
    chosen, names = images_from_data("arrays", str(data), 3, model.preprocess, seed=1,
                                     task=task_of(model))
    assert chosen.dtype == torch.float32 and chosen.shape == (3, 1, 16, 16)
    for image, name in zip(chosen, names, strict=True):
        index = int(name.split("#")[1].split(":")[0])
        assert torch.equal(image[0], torch.from_numpy(images[index]))
        assert name.endswith(f"temperature={targets[index, 0]:.4g}, "
                             f"pressure={targets[index, 1]:.4g}")
    assert len({name.split(":")[0] for name in names}) == 3


def test_float_images_are_drawn_as_their_channel_mean_with_a_colour_map():
    from vitkit.analysis.figures import _image_hwc

    image = torch.stack([torch.full((4, 4), 10.0), torch.arange(16.0).reshape(4, 4)])
    drawn = _image_hwc(image)
    mean = image.mean(0)
    np.testing.assert_allclose(drawn, ((mean - mean.min()) / (mean.max() - mean.min())).numpy())
    assert _image_hwc(torch.zeros(3, 4, 4, dtype=torch.uint8)).shape == (4, 4, 3)  # pictures


# -- export -------------------------------------------------------------------------------------
def test_onnx_of_a_regression_model_outputs_destandardised_values(tmp_path):
    from vitkit.export import check_onnx, export_onnx, read_metadata
    from vitkit.export.onnx import quiet_session

    model = regression_model()
    path = export_onnx(model, tmp_path / "reg.onnx")
    session = quiet_session(path)
    assert session.get_outputs()[0].name == "values"
    images = fields(3)
    x = ((images[:, None] - 0.5) / 0.25).astype(np.float32)
    got = session.run(None, {"images": x})[0]
    np.testing.assert_allclose(got, destandardised(model, images), atol=1e-4)
    meta = read_metadata(path)
    assert meta["task"] == {"kind": "regression", "names": NAMES, "loss": "mse",
                            "target_mean": MEAN, "target_std": STD}
    assert meta["output"]["name"] == "values" and "de-standardised" in meta["output"]["meaning"]
    assert check_onnx(model, path) <= 1e-4


def test_onnx_of_a_multilabel_model_outputs_logits_and_says_its_task(tmp_path):
    from vitkit.export import export_onnx, read_metadata
    from vitkit.export.onnx import quiet_session

    model = multilabel_model()
    path = export_onnx(model, tmp_path / "ml.onnx")
    x = np.random.default_rng(0).standard_normal((2, 1, 16, 16)).astype(np.float32)
    got = quiet_session(path).run(None, {"images": x})[0]
    with torch.no_grad():
        np.testing.assert_allclose(got, model(torch.from_numpy(x)).numpy(), atol=1e-4)
    meta = read_metadata(path)
    assert meta["task"]["kind"] == "multilabel" and meta["task"]["names"] == LABELS
    assert meta["output"]["name"] == "logits" and meta["output"]["task"] == "multilabel"


def test_cli_export_of_a_saved_regression_model(tmp_path, capsys):
    """A saved regression model exports its values, checked to a tolerance scaled by the
    targets' largest std (save_pretrained/load_pretrained carry model.task)."""
    folder = save_pretrained(regression_model(), tmp_path / "reg")
    assert main(["export", str(folder)]) == 0
    out = capsys.readouterr().out
    assert "output 'values'" in out and out.rstrip().endswith("OK")
    for part in ("tolerance 2e-4", "1e-4 x the targets' largest std 2", "1e-5"):
        assert part in out, out


# -- probe --------------------------------------------------------------------------------------
def _features(seed: int = 0, n: int = 120, d: int = 12, k: int = 2):
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((n, d))
    y = x @ rng.standard_normal((d, k)) + 0.5 * rng.standard_normal((n, k)) + 7.0
    return x[:90], y[:90], x[90:], y[90:]


def test_ridge_probe_equals_scikit_learns_ridge_and_r2():
    from sklearn.linear_model import Ridge
    from sklearn.metrics import mean_absolute_error, r2_score

    from vitkit.evaluation.probe import ridge_probe

    x_train, y_train, x_test, y_test = _features()
    result = ridge_probe(x_train, y_train, x_test, y_test, names=NAMES)
    mean, std = x_train.mean(0), x_train.std(0) + 1e-5  # the probe's standardisation
    reference = Ridge(alpha=result.regularisation).fit((x_train - mean) / std, y_train)
    predicted = reference.predict((x_test - mean) / std)
    np.testing.assert_allclose(result.outputs, predicted, rtol=1e-8, atol=1e-8)
    # the task's metrics decode the outputs in float32
    assert result.metrics["r2"] == pytest.approx(r2_score(y_test, predicted), abs=1e-6)
    assert result.metrics["mae"] == pytest.approx(mean_absolute_error(y_test, predicted))
    assert result.metrics["per_output"]["pressure"]["r2"] == pytest.approx(
        r2_score(y_test[:, 1], predicted[:, 1]))
    assert result.metrics["r2"] > 0.8  # the features do predict the targets
    assert list(result.as_dict()["heldout_r2"]) == [f"{a:g}" for a in result.heldout]


def test_ridge_probe_of_one_target_and_more_dims_than_samples():
    from sklearn.linear_model import Ridge

    from vitkit.evaluation.probe import fit_ridge

    rng = np.random.default_rng(1)
    x, y = rng.standard_normal((20, 50)), rng.standard_normal(20)
    probe = fit_ridge(x, y, 3.0)  # the dual form
    expected = Ridge(alpha=3.0).fit(x, y).predict(x)
    np.testing.assert_allclose(probe.predict(x)[:, 0], expected, atol=1e-8)


def test_multilabel_probe_map_equals_scikit_learns_average_precision():
    from sklearn.metrics import average_precision_score

    from vitkit.evaluation.probe import multilabel_probe

    rng = np.random.default_rng(2)
    x = rng.standard_normal((150, 8))
    y = (x[:, :3] + 0.7 * rng.standard_normal((150, 3)) > 0).astype(np.float32)
    result = multilabel_probe(x[:110], y[:110], x[110:], y[110:], names=LABELS)
    assert result.metrics["map"] == pytest.approx(
        average_precision_score(y[110:], result.outputs, average="macro"))
    assert result.metrics["map"] > 0.7


def test_probe_needs_enough_training_images():
    from vitkit.errors import InputError
    from vitkit.evaluation.probe import ridge_probe

    with pytest.raises(InputError) as info:
        ridge_probe(np.zeros((5, 3)), np.zeros(5), np.zeros((2, 3)), np.zeros(2))
    for part in ("at least 10", "training images", "got 5", "more training data"):
        assert part in str(info.value), str(info.value)


def test_cli_probe_of_a_regression_model_on_arrays(tmp_path, capsys):
    """The probe of a saved regression model is a ridge regression scored by R^2, equal to
    scikit-learn's on the same features (save_pretrained/load_pretrained carry model.task)."""
    from sklearn.linear_model import Ridge
    from sklearn.metrics import r2_score

    model = regression_model()
    folder = save_pretrained(model, tmp_path / "reg")
    data = tmp_path / "arrays"
    data.mkdir()
    split_data = {}
    for split, count, seed in (("train", 60, 0), ("test", 20, 1)):
        images = fields(count, seed=seed)
        targets = np.stack([images.mean((1, 2)), images[:, :8].std((1, 2))], 1)
        np.savez(data / f"{split}.npz", images=images, targets=targets.astype(np.float32))
        split_data[split] = images, targets.astype(np.float32)
    report = tmp_path / "probe.json"
    assert main(["probe", str(folder), "--data", "arrays", "--data-dir", str(data),
                 "--json", str(report)]) == 0
    out = capsys.readouterr().out
    assert "ridge regression" in out and "test R^2" in out
    result = json.loads(report.read_text())
    assert result["task"] == "regression"
    # the same probe by hand: features of a plain forward, scikit-learn's ridge and R^2
    features = {}
    for split, (images, _) in split_data.items():
        with torch.no_grad():
            x = (torch.from_numpy(images)[:, None] - 0.5) / 0.25
            features[split] = model.forward_head(model.forward_features(x),
                                                 pre_logits=True).double().numpy()
    mean, std = features["train"].mean(0), features["train"].std(0) + 1e-5
    ridge = Ridge(alpha=result["linear_probe"]["alpha"])
    ridge.fit((features["train"] - mean) / std, split_data["train"][1].astype(np.float64))
    predicted = ridge.predict((features["test"] - mean) / std)
    assert result["linear_probe"]["r2"] == pytest.approx(
        r2_score(split_data["test"][1], predicted), abs=1e-4)
