"""The AugReg checkpoints ("How to train your ViT?", gs://vit_models/augreg) by name.

References: timm's own pretrained configs (the `augreg_in21k` and `augreg_in21k_ft_in1k`
tags' URLs, and timm's models of the same names for parameter counts) and timm's reader of
official .npz files (`_load_weights`) for the logits (1e-5 at fp32). AugReg files use the
original vit_jax key layout without a pre-logits layer (vit_jax/configs/models.py:
representation_size=None), which the npz adapter already reads (tests/test_npz.py); here a
file of that layout is found by its release name and loaded by the checkpoint's name.
"""

import pytest
import timm
import timm.models.vision_transformer as timm_vit
import torch

import vitkit
from reference_models import randomise
from vitkit.catalog import config_of, count_parameters, load_pretrained
from vitkit.cli import main
from vitkit.weights import save_npz
from vitkit.weights.formats.hub import checkpoint_table, named_checkpoints

TOL = 1e-5


def timm_augreg_urls() -> dict[str, str]:
    """timm model tag -> release URL for every AugReg ImageNet-21k file timm knows."""
    urls = {}
    for name in timm.list_pretrained("*augreg_in21k*"):
        url = timm.models.get_pretrained_cfg(name).url or ""
        if "/vit_models/augreg/" in url:
            urls[name] = url
    return urls


def test_every_augreg_file_timm_knows_has_a_name():
    ours = set(named_checkpoints().values())
    urls = timm_augreg_urls()
    assert len(urls) >= 20
    assert set(urls.values()) <= ours


def test_models_checkpoints_lists_every_augreg_name_and_url(capsys):
    assert main(["models", "--checkpoints"]) in (0, None)
    out = capsys.readouterr().out
    for row in checkpoint_table():
        assert row.name in out and row.url in out
    for url in timm_augreg_urls().values():
        assert url in out
    b16 = next(line for line in out.splitlines() if line.startswith("B/16-augreg-i21k-i1k-384"))
    assert "86.00" in b16  # timm's results-imagenet.csv: 85.996


def test_plain_models_keeps_the_variants_and_points_to_the_table(capsys):
    assert main(["models"]) in (0, None)
    out = capsys.readouterr().out
    assert "86,567,656" in out and "B/16-i21k-i1k-384" in out
    assert "vitkit models --checkpoints" in out


@pytest.mark.parametrize("name, timm_name, classes", [
    ("Ti/16-augreg-i21k", "vit_tiny_patch16_224", 21843),
    ("Ti/16-augreg-i21k-i1k-384", "vit_tiny_patch16_384", 1000),
    ("S/32-augreg-i21k", "vit_small_patch32_224", 21843),
    ("R+Ti/16-augreg-i21k-i1k-224", "vit_tiny_r_s16_p8_224", 1000),
    ("R26+S/32-augreg-i21k-i1k-384", "vit_small_r26_s32_384", 1000),
])
def test_name_describes_the_model_timm_builds_for_it(name, timm_name, classes):
    config = config_of(name)
    reference = timm.create_model(timm_name, pretrained=False, num_classes=classes)
    assert config.pre_logits_dim == 0 and config.num_classes == classes
    assert config.img_size == tuple(reference.patch_embed.img_size)
    assert count_parameters(config) == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize("name", ["Ti/16-augreg-i21k", "Ti/16-augreg-i21k-i1k-224"])
def test_a_release_file_in_weights_dir_loads_by_name(tmp_path, name):
    config = config_of(name)
    model = randomise(vitkit.VisionTransformer(config))
    basename = named_checkpoints()[name].rsplit("/", 1)[1]
    path = save_npz(model, tmp_path / basename)  # the original layout, no pre_logits
    ours = load_pretrained(name, weights_dir=tmp_path, download=False)
    assert ours.config.num_classes == config.num_classes and ours.config.pre_logits_dim == 0
    reference = timm_vit.VisionTransformer(
        img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3,
        num_classes=config.num_classes, act_layer="gelu_tanh").eval()
    timm_vit._load_weights(reference, str(path))
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert (ours(images) - reference(images)).abs().max().item() <= TOL
