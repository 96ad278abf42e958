"""The stem abstraction: each stem's parameter count, FLOPs (against torch's FlopCounterMode),
token grid at odd sizes, first-layer filters and dynamic-size behaviour."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from vitkit import ConfigError, InputError, create_model
from vitkit.config import STEMS as CONFIG_STEMS
from vitkit.model.stems import STEMS, ConvStem, PatchStem, ResNetStem, build_stem
from vitkit.summary import forward_flops, summarize

REPO = Path(__file__).resolve().parents[2]
RECIPE = json.loads((REPO / "src/vitkit/recipes/cifar10.json").read_text())["model"]
CIFAR10_MODEL = ("Ti/4", {k: v for k, v in RECIPE.items() if k != "variant"})  # conv stem

# One small config per stem kind (and the hybrid's variants), for shape-level checks.
SMALL_STEMS = {
    "patch": ("Ti/16", {}),
    "conv": ("Ti/4", {"stem": "conv", "stem_channels": (8, 16, 24)}),
    "conv, strides placed": ("Ti/8", {"stem": "conv", "stem_channels": (8, 16, 16, 24),
                                      "stem_strides": (2, 1, 2, 2)}),
    "conv, pooled": ("Ti/8", {"stem": "conv", "stem_channels": (8, 16, 16, 24),
                              "stem_strides": (2, 1, 2, 2), "stem_pool": True}),
    "R50": ("R50+Ti/16", {}),
    "R26/32": ("R26+Ti/32", {}),
    "root-only R": ("R+Ti/32", {}),
}


def meta_model(name: str, **overrides) -> torch.nn.Module:
    return create_model(name, device="meta", **overrides).eval()


def test_every_configurable_stem_has_a_class():
    assert set(STEMS) == set(CONFIG_STEMS)
    for kind, (name, overrides) in SMALL_STEMS.items():
        config = meta_model(name, **overrides).config
        with torch.device("meta"):
            assert build_stem(config).kind == config.stem, kind


def test_stem_state_dict_names_are_those_the_checkpoint_readers_use():
    conv = meta_model("Ti/4", stem="conv", stem_channels=(8, 16)).patch_embed.state_dict()
    bn = ("weight", "bias", "running_mean", "running_var", "num_batches_tracked")
    assert list(conv) == ["convs.0.weight", *(f"convs.1.{k}" for k in bn), "convs.3.weight",
                          *(f"convs.4.{k}" for k in bn), "proj.weight", "proj.bias"]
    assert list(meta_model("Ti/16").patch_embed.state_dict()) == ["proj.weight", "proj.bias"]
    hybrid = meta_model("R50+Ti/16").state_dict()
    for key in ("patch_embed.backbone.stem.conv.weight", "patch_embed.backbone.stem.norm.bias",
                "patch_embed.backbone.stages.0.blocks.0.downsample.conv.weight",
                "patch_embed.backbone.stages.2.blocks.8.norm3.weight", "patch_embed.proj.bias"):
        assert key in hybrid


def test_conv_stem_strides_place_the_downsampling_and_a_wrong_list_says_how():
    stem = meta_model("Ti/8", stem="conv", stem_channels=(8, 16, 16, 24),
                      stem_strides=(2, 1, 2, 2)).patch_embed
    assert [conv.stride for conv in stem._convs()] == [(2, 2), (1, 1), (2, 2), (2, 2)]
    shapes, grid = stem.conv_shapes((32, 32))
    assert [shape.out_size for shape in shapes[:4]] == [(16, 16), (16, 16), (8, 8), (4, 4)]
    assert grid == (4, 4)
    default = meta_model("Ti/8", stem="conv", stem_channels=(8, 16, 16, 24)).patch_embed
    assert [conv.stride for conv in default._convs()] == [(1, 1), (2, 2), (2, 2), (2, 2)]
    with pytest.raises(ConfigError, match=r"e\.g\. \[1, 2, 2, 2\]") as info:
        meta_model("Ti/8", stem="conv", stem_channels=(8, 16, 16, 24), stem_strides=(2, 2, 1, 1))
    for part in ("stem_strides=[2, 2, 1, 1]", "log2(patch_size)=3", "patch size 8"):
        assert part in str(info.value), str(info.value)
    example = json.loads(str(info.value).rsplit("e.g. ", 1)[1])  # the message's fix works
    fixed = meta_model("Ti/8", stem="conv", stem_channels=(8, 16, 16, 24), stem_strides=example)
    assert fixed.config.stem_strides == (1, 2, 2, 2)
    assert type(fixed.config).from_dict(json.loads(fixed.config.to_json())) == fixed.config


def test_pooled_conv_stem_is_conv_then_max_pool_then_norm_and_relu():
    """Each halving conv runs at stride 1, and a 2x2 max-pooling halves its output: the same
    as the layers written out by hand, with the same parameters and the same token grid."""
    name, overrides = SMALL_STEMS["conv, pooled"]
    model = create_model(name, img_size=32, depth=1, **overrides).train()
    stem = model.patch_embed
    assert stem.pooled == (True, False, True, True)
    assert [conv.stride for conv in stem._convs()] == [(1, 1)] * 4
    assert stem.parameter_count() == meta_model(name, **{**overrides, "stem_pool": False}
                                                ).patch_embed.parameter_count()
    images = torch.randn(3, 3, 32, 32)
    expected, layers = images, iter(stem.convs)
    for pooled in stem.pooled:
        conv = next(layers)
        expected = conv(expected)
        if pooled:
            expected = torch.nn.functional.max_pool2d(expected, 2)
            next(layers)
        norm = next(layers)
        next(layers)  # the ReLU
        expected = torch.relu(torch.nn.functional.batch_norm(
            expected, None, None, norm.weight, norm.bias, training=True, eps=norm.eps))
    expected = stem.proj(expected)
    torch.testing.assert_close(stem.feature_map(images), expected, rtol=1e-5, atol=1e-5)
    assert stem.token_grid((32, 32)) == (4, 4) == tuple(expected.shape[-2:])


def test_stem_pool_without_a_conv_stem_says_how_to_fix_it():
    with pytest.raises(ConfigError, match="stem_pool=True") as info:
        meta_model("Ti/16", stem_pool=True)
    for part in ("conv stem", "'patch'", "stem='conv'", "stem_channels", "drop stem_pool"):
        assert part in str(info.value), str(info.value)

    fixed = meta_model("Ti/8", stem="conv", stem_channels=(8, 16, 24), stem_pool=True)
    assert fixed.patch_embed.token_grid((224, 224)) == (28, 28)
    assert meta_model("Ti/16").config.stem_pool is False  # ... or drop it


@pytest.mark.parametrize("kind", SMALL_STEMS)
def test_stem_parameter_count_equals_its_modules(kind):
    name, overrides = SMALL_STEMS[kind]
    stem = meta_model(name, **overrides).patch_embed
    assert stem.parameter_count() == sum(p.numel() for p in stem.parameters())


# -- FLOPs ----------------------------------------------------------------------------------------
FLOP_MODELS = {"B/16": ("B/16", {}), "R50+B/16": ("R50+B/16", {}),
               "R26+B/32": ("R26+B/32", {}), "cifar10 conv stem": CIFAR10_MODEL}


def counted_flops(model: torch.nn.Module, size: tuple[int, int]) -> tuple[int, int]:
    """torch's count for one image (a real forward on the meta device): total, convolutions.

    The full forward (every token through every block), as forward_flops counts the model:
    `model(x)` skips the last block's other tokens when it pools the class token."""
    images = torch.zeros(1, model.config.in_chans, *size, device="meta")
    with FlopCounterMode(display=False) as counter, torch.no_grad():
        model.forward_head(model.forward_features(images))
    counts = {str(op): flops for op, flops in counter.get_flop_counts()["Global"].items()}
    return counter.get_total_flops(), counts.get("aten.convolution", 0)


@pytest.mark.parametrize("label", FLOP_MODELS)
def test_summary_flops_equal_torch_flop_counter(label):
    name, overrides = FLOP_MODELS[label]
    model = meta_model(name, **overrides)
    total, convolutions = counted_flops(model, model.config.img_size)
    summary = summarize(model.config)
    assert summary.flops == pytest.approx(total, rel=0.01)
    assert summary.stem_flops == convolutions  # every convolution is the stem's, counted exactly
    assert forward_flops(model.config) == summary.flops


def test_hybrid_flops_are_not_the_plain_vits():
    hybrid, plain = summarize(meta_model("R50+B/16").config), summarize(meta_model("B/16").config)
    assert hybrid.flops > 1.2 * plain.flops  # the ResNet's 8 GFLOPs are counted
    assert hybrid.flops - hybrid.stem_flops == plain.flops - plain.stem_flops


@pytest.mark.parametrize(("label", "size"), [("conv", (33, 47)), ("conv, pooled", (33, 47)),
                                             ("R50", (70, 50)),
                                             ("patch", (48, 80))])
def test_flops_at_other_sizes_follow_the_stems_grid(label, size):
    name, overrides = SMALL_STEMS[label]
    model = meta_model(name, dynamic_img_size=True, depth=2, **overrides)
    total, convolutions = counted_flops(model, size)
    assert model.patch_embed.flops(size) == convolutions
    assert forward_flops(model.config, size) == pytest.approx(total, rel=0.01)


# -- token grid ----------------------------------------------------------------------------------
def ceil_div(a: int, b: int) -> int:
    return -(-a // b)


GRID_CASES = [  # stem, image size, expected grid from the stem's padding rule
    ("patch", (35, 50), (35 // 16, 50 // 16)),  # P x P, stride P, no padding: floor
    ("conv", (33, 47), (ceil_div(33, 4), ceil_div(47, 4))),  # 3x3 convs padded by 1: ceil
    ("conv, pooled", (33, 47), (ceil_div(33, 8), ceil_div(47, 8))),  # pools keep partial windows
    ("R50", (70, 50), (ceil_div(70, 16), ceil_div(50, 16))),  # SAME padding: ceil(size / 16)
    ("R26/32", (97, 33), (ceil_div(97, 32), ceil_div(33, 32))),
    ("root-only R", (100, 61), (ceil_div(100, 4) // 8, ceil_div(61, 4) // 8)),  # SAME, then 8x8
]


@pytest.mark.parametrize(("label", "size", "grid"), GRID_CASES)
def test_token_grid_and_feature_map_at_odd_sizes(label, size, grid):
    name, overrides = SMALL_STEMS[label]
    stem = meta_model(name, **overrides).patch_embed
    assert stem.token_grid(size) == grid
    features = stem.feature_map(torch.zeros(2, 3, *size, device="meta"))
    assert tuple(features.shape) == (2, 192, *grid)
    assert tuple(stem(torch.zeros(2, 3, *size, device="meta")).shape) == (2, grid[0] * grid[1],
                                                                           192)


def test_conv_stem_grid_on_real_pixels_at_an_odd_size():
    stem = create_model(SMALL_STEMS["conv"][0], **SMALL_STEMS["conv"][1]).patch_embed.eval()
    assert stem.token_grid((13, 18)) == (4, 5)
    assert stem.feature_map(torch.randn(1, 3, 13, 18)).shape[-2:] == (4, 5)


# -- first-layer filters ---------------------------------------------------------------------------
def test_patch_stem_filters_are_the_projection_e():
    stem = create_model("Ti/16", img_size=32, depth=1).patch_embed
    filters = stem.pixel_filters()
    assert isinstance(stem, PatchStem) and filters.layer == "proj"
    assert filters.weight.shape == (192, 3, 16, 16)
    assert torch.equal(filters.weight, stem.proj.weight)


def test_conv_stem_filters_are_its_first_3x3_conv():
    stem = create_model("Ti/4", img_size=16, depth=1, stem="conv",
                        stem_channels=(8, 16, 24)).patch_embed
    filters = stem.pixel_filters()
    assert isinstance(stem, ConvStem) and filters.layer == "convs.0"
    assert filters.weight.shape == (8, 3, 3, 3)
    assert torch.equal(filters.weight, stem.convs[0].weight)


def test_resnet_stem_filters_are_the_standardised_root_conv():
    stem = create_model("R+Ti/32", img_size=32, depth=1).patch_embed
    filters = stem.pixel_filters()
    assert isinstance(stem, ResNetStem) and filters.layer == "backbone.stem.conv"
    raw = stem.backbone.stem.conv.weight.detach().double()
    assert filters.weight.shape == raw.shape == (64, 3, 7, 7)
    # The official StdConv: (w - mean) / (std + 1e-5) over each output filter, population std.
    flat = raw.reshape(64, -1).numpy()
    expected = (flat - flat.mean(1, keepdims=True)) / (flat.std(1, keepdims=True) + 1e-5)
    torch.testing.assert_close(filters.weight.double().reshape(64, -1),
                               torch.from_numpy(expected), rtol=0, atol=1e-5)
    assert not torch.allclose(filters.weight, stem.backbone.stem.conv.weight, atol=1e-2)


# -- dynamic image size ----------------------------------------------------------------------------
def random_model(name: str, **overrides) -> torch.nn.Module:
    """Random non-zero weights everywhere, so positions and heads move the logits."""
    model = create_model(name, **{"img_size": 32, "depth": 2, "num_classes": 5, **overrides})
    with torch.no_grad():
        for param in model.parameters():
            param.normal_(0.0, 0.1)
        if isinstance(model.pos_embed, torch.nn.Parameter):
            model.pos_embed.normal_(0.0, 1.0)
    return model.eval()


DYNAMIC_CASES = {
    "learned": ("Ti/16", {}, (64, 48)),
    "sincos1d": ("Ti/16", {"pos_embed": "sincos1d"}, (48, 80)),
    "sincos2d": ("Ti/16", {"pos_embed": "sincos2d"}, (64, 32)),
    "GAP": ("Ti/16", {"class_token": False, "pool": "mean_patches"}, (48, 48)),
    "R50 hybrid": ("R50+Ti/16", {"img_size": 64, "depth": 1}, (96, 64)),
    "conv stem": ("Ti/4", {"stem": "conv", "stem_channels": (8, 16, 24)}, (24, 40)),
}


@pytest.mark.parametrize("label", DYNAMIC_CASES)
def test_dynamic_forward_equals_set_image_size_then_forward(label):
    name, overrides, size = DYNAMIC_CASES[label]
    model = random_model(name, **overrides)
    images = torch.randn(2, 3, *size)
    reference = copy.deepcopy(model)
    reference.set_image_size(size, mode="bilinear")
    model.set_dynamic_img_size()
    with torch.no_grad():
        got, expected = model(images), reference(images)
        native = torch.randn(2, 3, *model.config.img_size)
        strict = copy.deepcopy(model)
        strict.set_dynamic_img_size(False)
        torch.testing.assert_close(model(native), strict(native), rtol=0, atol=0)
    assert expected.abs().max() > 0.1  # a real signal
    torch.testing.assert_close(got, expected, rtol=0, atol=1e-5)
    assert model.config.img_size == ((64, 64) if label == "R50 hybrid" else (32, 32))
    if model.pos_embed is not None:  # the stored positions stay those of config.img_size
        assert model.pos_embed.shape[1] == model.config.seq_len


def test_dynamic_learned_positions_are_the_bilinear_resampling_and_train():
    model = random_model("Ti/16", dynamic_img_size=True)
    bilinear, bicubic = copy.deepcopy(model), copy.deepcopy(model)
    bilinear.set_image_size(64, mode="bilinear")
    bicubic.set_image_size(64, mode="bicubic")
    with torch.no_grad():
        fitted = model.positions((4, 4))
        assert torch.equal(fitted, bilinear.pos_embed)
        assert (fitted - bicubic.pos_embed).abs().max() > 0.05  # bilinear, not bicubic
    images = torch.randn(2, 3, 64, 64)
    model(images).square().sum().backward()  # gradients reach the stored 2x2 grid
    assert model.pos_embed.grad is not None and model.pos_embed.grad[:, 1:].abs().sum() > 0
    assert model.pos_embed.shape == (1, 5, 192)


def test_dynamic_size_is_a_config_option_and_round_trips():
    model = create_model("Ti/16", img_size=32, depth=1, dynamic_img_size=True)
    assert model.config.dynamic_img_size
    assert model(torch.randn(1, 3, 48, 64)).shape == (1, 1000)
    assert type(model.config).from_json(model.config.to_json()).dynamic_img_size


def test_strict_model_refuses_another_size_and_its_advice_works():
    model = create_model("Ti/16", img_size=32, depth=1, num_classes=3).eval()
    images = torch.randn(1, 3, 48, 64)
    with pytest.raises(InputError, match=r"set_dynamic_img_size\(\)") as error:
        model(images)
    assert "32x32" in str(error.value)
    model.set_dynamic_img_size()  # the advice
    assert model(images).shape == (1, 3)


def test_dynamic_patch_stem_refuses_partial_patches_and_its_advice_works():
    model = create_model("Ti/16", img_size=32, depth=1, num_classes=3,
                         dynamic_img_size=True).eval()
    with pytest.raises(InputError, match="multiples of 16") as error:
        model(torch.randn(1, 3, 50, 70))
    assert "e.g. 48x64" in str(error.value)
    assert model(torch.randn(1, 3, 48, 64)).shape == (1, 3)  # cropped as advised


def test_stems_say_which_sizes_they_take():
    sizes = {label: meta_model(name, **overrides).patch_embed.size_step
             for label, (name, overrides) in SMALL_STEMS.items()}
    # Patches must be whole; padded convs and a 1x1 projection on a SAME map take any size;
    # an 8x8 projection on the root-only map needs whole 32-pixel tokens.
    assert sizes == {"patch": 16, "conv": 1, "conv, strides placed": 1, "conv, pooled": 1,
                     "R50": 1, "R26/32": 1,
                     "root-only R": 32}
    conv = create_model("Ti/4", img_size=16, depth=1, stem="conv", stem_channels=(8, 16),
                        dynamic_img_size=True).eval()
    assert conv(torch.randn(1, 3, 13, 18)).shape == (1, 1000)  # ceil: 4x5 tokens


@pytest.mark.parametrize("kind", ["patch", "conv"])
@pytest.mark.parametrize("dynamic", [False, True])
def test_stem_tokens_are_contiguous_so_the_blocks_copy_nothing(kind, dynamic):
    """A transposed (B, N, D) view would carry its layout through every residual add, and
    each LayerNorm and Linear would copy it (15% of the CIFAR recipe's step)."""
    name, overrides = SMALL_STEMS[kind]
    model = create_model(name, img_size=32, class_token=False, pool="mean_all_tokens",
                         dynamic_img_size=dynamic, **overrides)
    tokens = model.embed(torch.randn(2, 3, 32, 32))
    assert tokens.is_contiguous()
