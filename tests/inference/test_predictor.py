"""`vitkit.inference.predictor`: a model ready for inference. Its outputs are the model's on
normalised, resized inputs; the speed paths compose on copies (the float model is never
changed); a live model keeps its mode; options are checked before any weights are read."""

from __future__ import annotations

import copy
import logging

import pytest
import torch

from vitkit import create_model, save_pretrained
from vitkit.data.transforms import resize_batch
from vitkit.errors import ConfigError, InputError
from vitkit.inference.predictor import InferenceOptions, Predictor, Provenance
from vitkit.inference.speedup import speed_up
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess

TINY = {"width": 32, "depth": 2, "num_heads": 2, "mlp_dim": 64, "patch_size": 4,
        "img_size": [16, 16], "init": "trunc_normal", "num_classes": 3}


@pytest.fixture
def model() -> VisionTransformer:
    torch.manual_seed(0)
    made = create_model(TINY).eval()
    made.preprocess = Preprocess(img_size=(16, 16), mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.4))
    made.class_names = ["cat", "dog", "sky"]
    return made


def pictures(count: int = 4, size: int = 16, seed: int = 0) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (count, 3, size, size), dtype=torch.uint8, generator=generator)


def test_outputs_are_the_models_on_normalised_resized_inputs(model):
    predictor = Predictor.from_model(model)
    images = pictures()
    with torch.no_grad():
        expected = model(model.preprocess.normalize(images))
    assert torch.equal(predictor(images), expected)
    assert torch.equal(predictor(list(images)), expected)  # (C, H, W) images, stacked
    larger = pictures(size=24)
    with torch.no_grad():
        resized = model(resize_batch(model.preprocess.normalize(larger), (16, 16)))
    assert torch.equal(predictor(larger), resized)
    assert predictor.precision.name == "fp32" and predictor.num_outputs == 3


def test_token_merging_runs_on_a_copy_that_shares_the_weights(model):
    predictor = Predictor.from_model(model, InferenceOptions(merge_tokens=2))
    assert type(model) is VisionTransformer  # the float model stays as loaded
    assert type(predictor.runner).__name__ == "MergingVisionTransformer"
    assert all(a is b for a, b in zip(predictor.runner.parameters(), model.parameters(),
                                      strict=True))
    merged = speed_up(copy.deepcopy(model), 2)
    images = pictures()
    with torch.no_grad():
        assert torch.equal(predictor(images), merged(model.preprocess.normalize(images)))


def test_a_live_model_runs_in_its_context_and_keeps_its_mode(model):
    model.train()
    entered = []

    class Context:
        def __enter__(self):
            entered.append(True)

        def __exit__(self, *exc):
            return False

    predictor = Predictor.from_model(model, InferenceOptions(tta="flip"), context=Context)
    outputs = predictor(pictures())
    assert entered and model.training and not outputs.requires_grad
    model.eval()
    with torch.no_grad():
        x = model.preprocess.normalize(pictures())
        assert torch.equal(outputs, (model(x) + model(x.flip(-1))) / 2)
    with pytest.raises(ConfigError) as info:
        Predictor.from_model(model, InferenceOptions(precision="bf16"), context=Context)
    for part in ("context", "as it is", "precision", "merge_tokens"):
        assert part in str(info.value), str(info.value)


def test_auto_measures_on_the_first_batch_when_asked(model, caplog):
    predictor = Predictor.from_model(model, InferenceOptions(precision="fp32",
                                                             measure_batch=None))
    assert not predictor.ready
    with caplog.at_level(logging.INFO):
        predictor(pictures())
    assert predictor.ready and "precision fp32" in caplog.text and "asked" in caplog.text


def test_a_contradiction_is_refused_before_the_weights_are_read(tmp_path):
    refusals = {
        ("--int8", "--precision bf16", "drop"): lambda: Predictor.load(
            tmp_path / "missing", InferenceOptions(precision="bf16", int8_engine="torch")),
        ("tta='mirror'", "flip"): lambda: InferenceOptions(tta="mirror"),
        ("options=InferenceOptions", "precision=", "not both"): lambda: InferenceOptions.given(
            InferenceOptions(), precision="bf16"),
    }
    for parts, call in refusals.items():
        with pytest.raises(ConfigError) as info:
            call()
        for part in parts:
            assert part in str(info.value), str(info.value)


def test_rows_name_the_classes(model):
    predictor = Predictor.from_model(model)
    outputs = predictor(pictures(2))
    rows = predictor.predictions(["a.png", "b.png"], outputs, topk=2)
    assert [row.path for row in rows] == ["a.png", "b.png"]
    assert set(rows[0].labels) <= {"cat", "dog", "sky"} and len(rows[0].labels) == 2
    assert predictor.describe(outputs, 1)[0]["top"][0]["label"] == rows[0].labels[0]
    with pytest.raises(InputError) as info:
        predictor.predictions(["a.png"], outputs[:1], topk=0)
    assert all(part in str(info.value) for part in ("topk", ">= 1", "got 0")), str(info.value)


def test_load_keeps_where_the_weights_came_from(model, tmp_path):
    folder = save_pretrained(model, tmp_path / "saved")
    predictor = Predictor.load(folder)
    assert predictor.provenance == Provenance(str(folder), predictor.provenance.path, "vitkit")
    assert predictor.names == ["cat", "dog", "sky"] and predictor.provenance.trained_on is None
    assert torch.equal(predictor(pictures()), Predictor.from_model(model)(pictures()))
