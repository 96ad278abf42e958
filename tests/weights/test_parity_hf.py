"""Weights of random Hugging Face ViTs copied into vitkit give the same outputs, and a
Hugging Face folder is read as transformers runs it: its problem_type is its task
(regression and multi-label outputs, not softmax classes), a folder split into shards loads,
and a missing shard is named.

Both key layouts are covered: the Hub's (written by `save_pretrained`) and the live
`state_dict()` of the installed transformers. Tolerance: 1e-5 max abs at fp32.
"""

import json
import re
from pathlib import Path

import numpy as np
import pytest
import safetensors.torch as safetensors_torch
import torch
import transformers
from PIL import Image

import vitkit
from reference_models import randomise
from vitkit import VisionTransformer
from vitkit.cli import main
from vitkit.errors import CheckpointError
from vitkit.tasks import task_of
from vitkit.weights import convert_hf, load_state_dict_checked

TOL = 1e-5


def _hf_config(**kwargs):
    defaults = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                    intermediate_size=128, image_size=32, patch_size=8, num_labels=10)
    return transformers.ViTConfig(**{**defaults, **kwargs})


def _vitkit(state_dict, config) -> VisionTransformer:
    vit_config, converted = convert_hf(state_dict, config)
    model = VisionTransformer(vit_config).eval()
    load_state_dict_checked(model, converted)
    return model


@pytest.mark.parametrize("batch", [1, 4, 8])
def test_hf_classifier_logits_match(batch):
    reference = randomise(transformers.ViTForImageClassification(_hf_config()), std=0.2)
    model = _vitkit(reference.state_dict(), reference.config)
    images = torch.randn(batch, 3, 32, 32)
    with torch.no_grad():
        diff = (model(images) - reference(pixel_values=images).logits).abs().max().item()
    assert diff <= TOL


def test_hf_non_square_one_channel_without_qkv_bias():
    config = _hf_config(image_size=[32, 48], num_channels=1, qkv_bias=False)
    reference = randomise(transformers.ViTForImageClassification(config), std=0.2)
    model = _vitkit(reference.state_dict(), reference.config)
    images = torch.randn(3, 1, 32, 48)
    with torch.no_grad():
        diff = (model(images) - reference(pixel_values=images).logits).abs().max().item()
    assert diff <= TOL


def test_hf_save_pretrained_folder_hub_layout(tmp_path):
    reference = randomise(transformers.ViTForImageClassification(_hf_config()), std=0.2)
    reference.save_pretrained(tmp_path)
    state_dict = safetensors_torch.load_file(tmp_path / "model.safetensors")
    assert any(".attention.attention.query." in key for key in state_dict)  # Hub key style
    import json
    config = json.loads((tmp_path / "config.json").read_text())
    model = _vitkit(state_dict, config)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        diff = (model(images) - reference(pixel_values=images).logits).abs().max().item()
    assert diff <= TOL


def test_hf_pooler_becomes_pre_logits_and_gelu_tanh_is_mapped():
    config = _hf_config(hidden_act="gelu_pytorch_tanh", layer_norm_eps=1e-6)
    reference = randomise(transformers.ViTModel(config), std=0.2)
    model = _vitkit(reference.state_dict(), reference.config)
    assert model.config.act == "gelu_tanh" and model.config.pre_logits_dim == 64
    assert model.config.num_classes == 0
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        out = reference(pixel_values=images)
        assert (model(images) - out.pooler_output).abs().max().item() <= TOL
        tokens = model.forward_features(images)
        assert (tokens - out.last_hidden_state).abs().max().item() <= TOL


@pytest.mark.parametrize("size", [48, 16])
def test_hf_folder_at_another_size_gives_hf_interpolated_logits(tmp_path, size):
    """Hugging Face resizes the positions in `ViTEmbeddings.interpolate_pos_encoding`
    (bicubic, half-pixel, no antialiasing) when a model reads another size; a Hugging Face
    folder loaded at that size by default gives the same logits (timm's antialiased
    resampling would not).
"""
    from vitkit import load_pretrained

    reference = randomise(transformers.ViTForImageClassification(_hf_config()), std=0.2).eval()
    reference.save_pretrained(tmp_path)
    model = load_pretrained(tmp_path, img_size=size).eval()
    images = torch.randn(2, 3, size, size)
    with torch.no_grad():
        expected = reference(pixel_values=images, interpolate_pos_encoding=True).logits
        diff = (model(images) - expected).abs().max().item()
        as_timm = load_pretrained(tmp_path, img_size=size, pos_interpolation="timm").eval()
        timm_diff = (as_timm(images) - expected).abs().max().item()
    assert diff <= TOL
    assert timm_diff > 10 * TOL  # the test tells the two conventions apart


def _hf(tmp_path: Path, name: str, **config) -> torch.nn.Module:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    model = ViTForImageClassification(ViTConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
        image_size=32, patch_size=8, **config)).eval()
    model.save_pretrained(str(tmp_path / name))
    return model


def _hf_logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(pixel_values=x).logits


def test_hugging_face_regression_and_multi_label_models_keep_their_task(tmp_path: Path,
                                                                         capsys) -> None:
    x = torch.randn(2, 3, 32, 32)
    regression = _hf(tmp_path, "reg", num_labels=2, problem_type="regression",
                     id2label={0: "age", 1: "height"}, label2id={"age": 0, "height": 1})
    ours = vitkit.load_pretrained(tmp_path / "reg")
    task = task_of(ours)
    assert (task.spec.kind, task.names) == ("regression", ["age", "height"])
    with torch.no_grad():
        values = task.decode(ours(x))  # no standardisation stored: the raw outputs
    assert torch.allclose(values, _hf_logits(regression, x), atol=TOL)

    multi = _hf(tmp_path, "multi", num_labels=5, problem_type="multi_label_classification")
    ours = vitkit.load_pretrained(tmp_path / "multi")
    assert task_of(ours).spec.kind == "multilabel"
    with torch.no_grad():
        assert torch.allclose(ours(x), _hf_logits(multi, x), atol=TOL)
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(tmp_path / "x.png")
    assert main(["predict", str(tmp_path / "reg"), str(tmp_path / "x.png")]) == 0
    assert re.search(r"x\.png: age=-?\d", capsys.readouterr().out)

    _hf(tmp_path, "odd", num_labels=2)
    meta = json.loads((tmp_path / "odd" / "config.json").read_text())
    (tmp_path / "odd" / "config.json").write_text(json.dumps({**meta, "problem_type": "rank"}))
    with pytest.raises(CheckpointError) as refused:
        vitkit.load_pretrained(tmp_path / "odd")
    says(refused.value, "'problem_type'", "'rank'", "single_label_classification", "regression")


def test_a_hugging_face_folder_split_into_shards_loads(tmp_path: Path) -> None:
    model = _hf(tmp_path, "whole", num_labels=3)
    model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="100KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(vitkit.load_pretrained(tmp_path / "sharded")(x),
                              _hf_logits(model, x), atol=TOL)
    (tmp_path / "sharded" / shards[-1]).unlink()
    with pytest.raises(CheckpointError) as refused:
        vitkit.load_pretrained(tmp_path / "sharded")
    says(refused.value, f"'{shards[-1]}'", "not a file", "download or copy the whole folder")


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"
