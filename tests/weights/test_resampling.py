"""Position embeddings follow a new image size the way each format's own code does it.

References, computed independently here: the official formula (vit_jax `load_pretrained`
and big_vision `resample_posemb`: `scipy.ndimage.zoom(grid, (new/old, new/old, 1), order=1)`)
and timm's `resample_abs_pos_embed` with its defaults (bicubic, antialiased), which timm's
`checkpoint_filter_fn` uses. Tolerances: 1e-5 max abs against scipy (float64 vs float32
arithmetic), 1e-6 against timm (the same torch kernel).
"""

from __future__ import annotations

import logging

import numpy as np
import pytest
import scipy.ndimage
import torch
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed

import vitkit
from reference_models import randomise
from vitkit.catalog import load_pretrained
from vitkit.errors import ConfigError
from vitkit.weights import POS_INTERPOLATIONS, save_npz, save_pretrained


def _official_zoom(pos: torch.Tensor, old: int, new: int, prefix: int = 1) -> np.ndarray:
    """vit_jax's resize: the class token's row kept, the square grid zoomed with order=1."""
    tok, grid = pos[0, :prefix].numpy(), pos[0, prefix:].numpy().reshape(old, old, -1)
    zoomed = scipy.ndimage.zoom(grid, (new / old, new / old, 1), order=1)
    return np.concatenate([tok, zoomed.reshape(new * new, -1)])[None]


@pytest.fixture(scope="module")
def model_224() -> vitkit.VisionTransformer:
    """A B/16-shaped position table (14x14 at 224) in a one-layer Ti model."""
    return randomise(vitkit.create_model("Ti/16", img_size=224, depth=1, num_classes=3,
                                          act="gelu_tanh"))


def test_official_file_at_384_equals_vit_jax(model_224, tmp_path, caplog):
    path = save_npz(model_224, tmp_path / "b16.npz")
    with caplog.at_level(logging.INFO):
        model = load_pretrained(path, img_size=384)
    expected = _official_zoom(model_224.pos_embed.detach(), 14, 24)
    assert np.abs(model.pos_embed.detach().numpy() - expected).max() <= 1e-5
    assert "position embeddings resampled 14x14 -> 24x24, bilinear, corners aligned" \
        in caplog.text


def test_big_vision_file_resamples_the_patch_grid_as_big_vision(model_224, tmp_path):
    # big_vision's table has no class-token row; vitkit reads it with a zero row in front
    path = save_npz(model_224, tmp_path / "bv.npz", layout="big_vision")
    model = load_pretrained(path, img_size=384)
    grid = model_224.pos_embed.detach()[:, 1:]
    expected = _official_zoom(grid, 14, 24, prefix=0)
    assert np.abs(model.pos_embed.detach()[:, 1:].numpy() - expected).max() <= 1e-5


def test_timm_file_default_equals_timm_resample_abs_pos_embed(model_224, tmp_path, caplog):
    save_file(model_224.state_dict(), tmp_path / "timm.safetensors")
    with caplog.at_level(logging.INFO):
        model = load_pretrained(tmp_path / "timm.safetensors", img_size=(384, 320))
    expected = resample_abs_pos_embed(model_224.pos_embed.detach(), [24, 20], [14, 14],
                                      num_prefix_tokens=1)
    assert (model.pos_embed.detach() - expected).abs().max().item() <= 1e-6
    assert "14x14 -> 24x20, bicubic, half-pixel, antialiased" in caplog.text


@pytest.mark.parametrize("size", [384, 112])  # growing and shrinking
def test_conventions_are_selectable_both_ways(model_224, tmp_path, size):
    npz = save_npz(model_224, tmp_path / "b16.npz")
    save_file(model_224.state_dict(), tmp_path / "timm.safetensors")
    pos, new = model_224.pos_embed.detach(), size // 16
    as_timm = load_pretrained(npz, img_size=size, pos_interpolation="timm").pos_embed.detach()
    expected = resample_abs_pos_embed(pos, [new, new], [14, 14], num_prefix_tokens=1)
    assert (as_timm - expected).abs().max().item() <= 1e-6
    as_official = load_pretrained(tmp_path / "timm.safetensors", img_size=size,
                                  pos_interpolation="official").pos_embed.detach()
    assert np.abs(as_official.numpy() - _official_zoom(pos, 14, new)).max() <= 1e-5


def test_vitkit_folders_keep_half_pixel_bilinear(model_224, tmp_path):
    folder = save_pretrained(model_224, tmp_path / "mine")
    model = load_pretrained(folder, img_size=384)
    expected = resample_abs_pos_embed(model_224.pos_embed.detach(), [24, 24], [14, 14],
                                      num_prefix_tokens=1, interpolation="bilinear",
                                      antialias=False)
    assert (model.pos_embed.detach() - expected).abs().max().item() <= 1e-6


def test_an_unknown_convention_names_the_known_ones(model_224, tmp_path):
    path = save_npz(model_224, tmp_path / "b16.npz")
    with pytest.raises(ConfigError, match="official, timm, bilinear, bicubic"):
        load_pretrained(path, img_size=384, pos_interpolation="jax")
    assert POS_INTERPOLATIONS == ("auto", "official", "timm", "bilinear", "bicubic")


def _hf_folder(model_224, folder):
    """A Hugging Face folder (transformers' save_pretrained) of a B/16-shaped position table."""
    import transformers

    config = transformers.ViTConfig(hidden_size=192, num_hidden_layers=1, num_attention_heads=3,
                                    intermediate_size=768, image_size=224, patch_size=16,
                                    num_labels=3)
    reference = transformers.ViTForImageClassification(config)
    with torch.no_grad():
        reference.vit.embeddings.position_embeddings.copy_(model_224.pos_embed)
    reference.save_pretrained(folder)
    return folder


@pytest.mark.parametrize("origin,expected_name", [("npz", "official"), ("timm", "timm"),
                                                   ("huggingface", "bicubic")])
def test_a_converted_folder_resizes_as_the_file_it_came_from(model_224, tmp_path, origin,
                                                             expected_name):
    """An .npz, timm or HF file converted to a vitkit folder (load, save_pretrained) and loaded
    at another size resamples its positions as the original file does, not with the folders'
    old default ("bilinear": 2.7e-3 / 1.6e-3 from the original's logits at 96 px)."""
    import json

    if origin == "npz":
        original = save_npz(model_224, tmp_path / "b16.npz")
    elif origin == "timm":
        original = tmp_path / "timm.safetensors"
        save_file(model_224.state_dict(), original)
    else:
        original = _hf_folder(model_224, tmp_path / "hf")
    folder = save_pretrained(load_pretrained(original), tmp_path / "converted")
    assert json.loads((folder / "config.json").read_text())["pos_interpolation"] \
        == expected_name
    for size in (384, 96):
        want = load_pretrained(original, img_size=size).pos_embed.detach()
        got = load_pretrained(folder, img_size=size).pos_embed.detach()
        old_default = load_pretrained(folder, img_size=size,
                                      pos_interpolation="bilinear").pos_embed.detach()
        assert torch.equal(got, want)
        assert (old_default - want).abs().max().item() > 1e-3  # the two are told apart
    # saved again from the folder, the convention stays
    again = save_pretrained(load_pretrained(folder), tmp_path / "again")
    assert json.loads((again / "config.json").read_text())["pos_interpolation"] \
        == expected_name


def test_a_folder_with_an_unknown_convention_is_refused_with_the_known_ones(model_224,
                                                                            tmp_path):
    import json

    from vitkit.errors import CheckpointError

    folder = save_pretrained(load_pretrained(save_npz(model_224, tmp_path / "b16.npz")),
                             tmp_path / "converted")
    meta = json.loads((folder / "config.json").read_text())
    meta["pos_interpolation"] = "jax"
    (folder / "config.json").write_text(json.dumps(meta))
    with pytest.raises(CheckpointError) as refused:
        load_pretrained(folder)
    says(refused.value, "'pos_interpolation'", "'jax'", "official, timm, bilinear, bicubic")

    meta["pos_interpolation"] = "official"  # the fix the message names
    (folder / "config.json").write_text(json.dumps(meta))
    assert load_pretrained(folder, img_size=96).pos_embed.shape == (1, 37, 192)


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"
