"""Weights of random timm VisionTransformers copied into vitkit give the same logits.

Tolerance: 1e-5 max abs difference at fp32 (observed: bit-identical).
"""

import pytest
import timm.models.vision_transformer as timm_vit
import torch

from reference_models import randomise
from vitkit import VisionTransformer
from vitkit.weights import convert_timm, load_state_dict_checked
from vitkit.weights.formats.timm import config_from_timm_model

TOL = 1e-5


def _timm(**kwargs) -> torch.nn.Module:
    defaults = dict(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                    num_classes=7)
    return randomise(timm_vit.VisionTransformer(**{**defaults, **kwargs}), std=0.2)


def _vitkit_from(timm_model) -> VisionTransformer:
    config, state_dict = config_from_timm_model(timm_model)
    model = VisionTransformer(config).eval()
    load_state_dict_checked(model, state_dict)
    return model


CASES = {
    "class_token": dict(global_pool="token"),
    "avg_with_class_token": dict(global_pool="avg"),
    "avg_no_class_token": dict(global_pool="avg", class_token=False),
    "token_no_qkv_bias": dict(global_pool="token", qkv_bias=False),
    "avg_no_qkv_bias": dict(global_pool="avg", qkv_bias=False),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("batch", [1, 3, 8])
def test_timm_logits_match(case, batch):
    reference = _timm(**CASES[case])
    model = _vitkit_from(reference)
    images = torch.randn(batch, 3, 32, 32)
    with torch.no_grad():
        diff = (model(images) - reference(images)).abs().max().item()
    assert diff <= TOL


@pytest.mark.parametrize("case", ["class_token", "avg_no_class_token"])
def test_timm_non_square_one_channel_image(case):
    reference = _timm(img_size=(32, 48), in_chans=1, **CASES[case])
    model = _vitkit_from(reference)
    assert model.config.img_size == (32, 48) and model.config.in_chans == 1
    images = torch.randn(2, 1, 32, 48)
    with torch.no_grad():
        assert (model(images) - reference(images)).abs().max().item() <= TOL


def test_timm_b16_sized_model_matches():
    reference = randomise(timm_vit.VisionTransformer(img_size=64, num_classes=10), std=0.2)
    for param in reference.parameters():
        param.data.mul_(0.1)
    model = _vitkit_from(reference)
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (model(images) - reference(images)).abs().max().item() <= TOL


def test_state_dict_alone_infers_the_config():
    reference = _timm(global_pool="avg", class_token=False, embed_dim=192, num_heads=3)
    config, _ = convert_timm(reference.state_dict())
    assert (config.width, config.num_heads, config.depth, config.mlp_dim) == (192, 3, 2, 768)
    assert config.pool == "mean_patches" and config.final_norm == "pooled"
    assert not config.class_token and config.num_classes == 7
