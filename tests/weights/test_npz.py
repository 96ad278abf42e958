"""Official .npz layouts: files written by vitkit load into vitkit and into timm through
timm's own reader of the official files (`_load_weights`), and the logits agree.

Tolerance: 1e-5 max abs difference on the logits at fp32. timm drops the pre-logits layer,
so for files with one the timm side gets it applied by hand from the file's arrays.
For the hybrid, timm's ResNet differs from the official code in two constants (GroupNorm
epsilon 1e-5 instead of 1e-6; weight standardisation / sqrt(var + 1e-8) instead of
/ (std + 1e-5)); the reference is set to the official ones before comparing.
"""

import re

import numpy as np
import pytest
import timm
import timm.models.vision_transformer as timm_vit
import torch
from safetensors.torch import save_file

import vitkit
from reference_models import official_resnet_constants, randomise
from vitkit.catalog import load_pretrained
from vitkit.model.resnet import StdConv2d, same_padding
from vitkit.weights import convert_npz, read_npz, save_npz, to_official_arrays

TOL = 1e-5
IMG = 64


def _vitkit_model(name: str = "Ti/16", **overrides) -> vitkit.VisionTransformer:
    settings = dict(img_size=IMG, depth=2, num_classes=7, act="gelu_tanh")
    return randomise(vitkit.create_model(name, **{**settings, **overrides}))


def _timm_model(**kwargs) -> torch.nn.Module:
    settings = dict(img_size=IMG, patch_size=16, embed_dim=192, depth=2, num_heads=3,
                    num_classes=7, act_layer="gelu_tanh")
    return timm_vit.VisionTransformer(**{**settings, **kwargs}).eval()


def _logits_both(path, timm_model, batch: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    timm_vit._load_weights(timm_model, str(path))
    ours = load_pretrained(path)
    images = torch.randn(batch, 3, IMG, IMG)
    with torch.no_grad():
        return ours(images), timm_model(images)


@pytest.mark.parametrize("layout", ["original", "opt_target"])
@pytest.mark.parametrize("batch", [1, 4])
def test_original_layouts_match_timm_reader(tmp_path, layout, batch):
    path = save_npz(_vitkit_model(), tmp_path / f"{layout}.npz", layout)
    ours, reference = _logits_both(path, _timm_model(), batch)
    assert (ours - reference).abs().max().item() <= TOL


@pytest.mark.parametrize("layout", ["big_vision", "scan"])
def test_linen_layouts_match_timm_reader(tmp_path, layout):
    # big_vision adds no position to the class token: timm's `no_embed_class` model.
    path = save_npz(_vitkit_model(), tmp_path / f"{layout}.npz", layout)
    ours, reference = _logits_both(path, _timm_model(no_embed_class=True))
    assert (ours - reference).abs().max().item() <= TOL


@pytest.mark.parametrize("layout", ["original", "opt_target", "big_vision", "scan"])
def test_gap_models_match_timm_reader(tmp_path, layout):
    # The "gap" classifier: final LayerNorm on all tokens, then their mean; no class token.
    model = _vitkit_model(class_token=False, pool="mean_patches")
    path = save_npz(model, tmp_path / "gap.npz", layout)
    reference = _timm_model(class_token=False, global_pool="avg", fc_norm=False)
    ours, theirs = _logits_both(path, reference)
    assert (ours - theirs).abs().max().item() <= TOL
    assert load_pretrained(path).config.pool == "mean_patches"


@pytest.mark.parametrize("layout", ["original", "big_vision"])
def test_pre_logits_kept_unlike_timm(tmp_path, layout):
    """ImageNet-21k files carry a tanh pre-logits layer; timm skips it, vitkit keeps it."""
    model = _vitkit_model(pre_logits_dim=192, num_classes=11)
    path = save_npz(model, tmp_path / "i21k.npz", layout)
    arrays = read_npz(path)
    prefix = "params/" if layout == "big_vision" else ""
    timm_model = _timm_model(num_classes=11, **({"no_embed_class": True} if prefix else {}))
    timm_vit._load_weights(timm_model, str(path))
    ours = load_pretrained(path)
    assert ours.config.pre_logits_dim == 192
    images = torch.randn(2, 3, IMG, IMG)
    kernel = torch.from_numpy(arrays[f"{prefix}pre_logits/kernel"])
    bias = torch.from_numpy(arrays[f"{prefix}pre_logits/bias"])
    with torch.no_grad():
        pooled = timm_model.forward_head(timm_model.forward_features(images), pre_logits=True)
        reference = timm_model.head(torch.tanh(pooled @ kernel + bias))
        diff = (ours(images) - reference).abs().max().item()
        timm_alone = (ours(images) - timm_model(images)).abs().max().item()
    assert diff <= TOL
    assert timm_alone > 1e-2  # what dropping the layer costs


PREFIXES = {"original": "", "opt_target": "opt/target/", "big_vision": "params/",
            "scan": "params/"}
HYBRIDS = {  # vitkit name (ViT-Ti width, one layer) -> timm model with the same ResNet stem
    "R50+Ti/16": ("vit_base_r50_s16_224", (3, 4, 9)),
    "R26+Ti/32": ("vit_small_r26_s32_224", (2, 2, 2, 2)),
    "R+Ti/32": ("vit_tiny_r_s16_p8_224", ()),  # the root block only, as the released R+Ti/16
}


@pytest.mark.parametrize("layout", ["original", "opt_target", "big_vision", "scan"])
@pytest.mark.parametrize("name", list(HYBRIDS))
def test_hybrid_matches_timm_reader(tmp_path, layout, name):
    timm_name, layers = HYBRIDS[name]
    model = _vitkit_model(name, depth=1, num_classes=5)
    with torch.no_grad():  # GroupNorm scales near 1, as in trained weights
        for param_name, param in model.named_parameters():
            if "backbone" in param_name and "norm" in param_name and param_name.endswith("weight"):
                param.add_(1.0)
    path = save_npz(model, tmp_path / "hybrid.npz", layout)
    assert read_npz(path)[PREFIXES[layout] + "gn_root/scale"].shape == (1, 1, 1, 64)  # as released
    no_embed_class = layout in ("big_vision", "scan")  # no position added to the class token
    reference = timm.create_model(timm_name, img_size=IMG, embed_dim=192, depth=1,
                                  num_heads=3, num_classes=5, act_layer="gelu_tanh",
                                  **({"no_embed_class": True} if no_embed_class else {}))
    official_resnet_constants(reference)
    ours, theirs = _logits_both(path, reference.eval())
    assert (ours - theirs).abs().max().item() <= TOL
    assert load_pretrained(path).config.resnet_layers == layers


def test_official_root_only_hybrid_name():
    # "R+ViT-Ti_16" is named after ViT-Ti/16 but puts 8x8 patches on the stride-4 root block.
    config = vitkit.variant_config("R+ViT-Ti_16")
    assert (config.name, config.patch_size, config.resnet_layers) == ("R+Ti/32", 32, ())
    assert vitkit.count_parameters("R+ViT-Ti_16") == 6_337_704  # as timm's vit_tiny_r_s16_p8_224
    assert vitkit.variant_config("vit_tiny_r_s16_p8_384").img_size == (384, 384)


def test_weight_standardisation_is_the_official_formula():
    conv = StdConv2d(5, 4, 3)
    with torch.no_grad():
        conv.weight.normal_(0.01, 0.02)
    kernel = conv.weight.detach().double().numpy().transpose(2, 3, 1, 0)  # HWIO, as in Flax
    mean = kernel.mean(axis=(0, 1, 2), keepdims=True)
    official = (kernel - mean) / (kernel.std(axis=(0, 1, 2), keepdims=True) + 1e-5)
    ours = conv.standardized_weight().detach().numpy().transpose(2, 3, 1, 0)
    np.testing.assert_allclose(ours, official, atol=1e-5)
    timm_formula = (kernel - mean) / np.sqrt(kernel.var(axis=(0, 1, 2), keepdims=True) + 1e-8)
    assert np.abs(timm_formula - official).max() > 1e-4  # the constant matters


def test_same_padding_is_tensorflow_same():
    # 7x7/2 on 224: 5 pixels of padding, 2 before and 3 after; 3x3/2 on 112: 0 and 1.
    assert same_padding(224, 7, 2) == (2, 3)
    assert same_padding(112, 3, 2) == (0, 1)
    assert same_padding(56, 1, 2) == (0, 0)
    assert same_padding(15, 3, 1) == (1, 1)


def test_r50_b16_parameter_count():
    assert vitkit.count_parameters("R50+B/16") == 98_659_112
    assert vitkit.count_parameters("R50+ViT-B_16") == 98_659_112


@pytest.mark.parametrize("layout", ["original", "opt_target", "big_vision", "scan"])
def test_variant_inferred_from_shapes(tmp_path, layout):
    model = vitkit.create_model("S/32", img_size=96, num_classes=3, depth=12)
    path = save_npz(model, tmp_path / "s32.npz", layout)
    config = load_pretrained(path).config
    assert (config.name, config.img_size, config.num_classes, config.act,
            config.norm_eps) == ("S/32", (96, 96), 3, "gelu_tanh", 1e-6)


def test_non_square_grid_needs_and_takes_the_training_size(tmp_path):
    model = _vitkit_model(img_size=(32, 64))
    path = save_npz(model, tmp_path / "wide.npz")
    with pytest.raises(vitkit.VitkitError, match="img_size"):
        load_pretrained(path)
    loaded = load_pretrained(path, source_img_size=(32, 64))
    images = torch.randn(2, 3, 32, 64)
    with torch.no_grad():
        assert (loaded(images) - model(images)).abs().max().item() <= TOL


def _follow_non_square_message(path, true_size: tuple[int, int]) -> torch.nn.Module:
    """Load `path`, read the error, make the call it suggests, and return what it loads."""
    with pytest.raises(vitkit.VitkitError) as info:
        load_pretrained(path)
    message = str(info.value)
    listed = [(int(h), int(w)) for h, w in re.findall(r"\((\d+), (\d+)\)", message)]
    assert true_size in listed, message
    example = re.search(r"load_pretrained\(path, source_img_size=\(\d+, \d+\)\)", message)
    assert example is not None, message
    suggested = eval(example.group(0), {"load_pretrained": load_pretrained, "path": path})
    assert suggested.config.img_size in listed
    return load_pretrained(path, source_img_size=true_size)


def test_non_square_npz_message_names_the_call_that_works(tmp_path):
    model = _vitkit_model(img_size=(32, 64))
    path = save_npz(model, tmp_path / "wide.npz")
    images = torch.randn(2, 3, 32, 64)
    loaded = _follow_non_square_message(path, (32, 64))
    alone = load_pretrained(path, img_size=(32, 64))  # as many cells: the training size
    with torch.no_grad():
        assert (loaded(images) - model(images)).abs().max().item() <= TOL
        assert torch.equal(alone(images), loaded(images))
    # another cell count cannot be the training size: the same advice, which then works
    with pytest.raises(vitkit.VitkitError, match=r"source_img_size=\(height, width\)"):
        load_pretrained(path, img_size=(64, 64))
    resized = load_pretrained(path, source_img_size=(32, 64), img_size=(64, 64))
    assert resized.pos_embed.shape == (1, 1 + 16, 192)


def test_non_square_timm_file_message_names_the_call_that_works(tmp_path):
    reference = randomise(_timm_model(img_size=(32, 64), depth=1))
    save_file(reference.state_dict(), tmp_path / "wide.safetensors")
    path = tmp_path / "wide.safetensors"
    loaded = _follow_non_square_message(path, (32, 64))
    images = torch.randn(2, 3, 32, 64)
    with torch.no_grad():
        assert (loaded(images) - reference(images)).abs().max().item() <= TOL
        assert torch.equal(load_pretrained(path, img_size=(32, 64))(images), loaded(images))


def test_scan_layout_stacks_layers(tmp_path):
    arrays = to_official_arrays(_vitkit_model(depth=3), "scan")
    assert arrays["params/Transformer/encoderblock/LayerNorm_0/scale"].shape == (3, 192)
    config, state = convert_npz(arrays)
    assert config.depth == 3 and "blocks.2.mlp.fc2.bias" in state
