"""Configs round-trip through JSON; variant names parse; bad configs say how to fix them."""

import json
import re

import pytest

from vitkit import ConfigError, ViTConfig, create_model, variant_config
from vitkit.cli import main
from vitkit.config import list_model_names


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"


def test_json_round_trip_through_file_and_string(tmp_path):
    config = ViTConfig(img_size=(60, 100), patch_size=20, in_chans=1, num_classes=1,
                       pos_embed="sincos1d", pool="mean_all_tokens", act="gelu_tanh",
                       pre_logits_dim=32, width=64, num_heads=4, mlp_dim=128, depth=2)
    path = tmp_path / "config.json"
    config.to_json(path)
    assert ViTConfig.from_json(path) == config
    assert ViTConfig.from_json(config.to_json()) == config
    assert json.loads(path.read_text())["img_size"] == [60, 100]


def test_model_built_from_json_config_file(tmp_path):
    path = tmp_path / "tiny.json"
    path.write_text(json.dumps({"img_size": 32, "patch_size": 4, "width": 48, "depth": 1,
                                "num_heads": 4, "mlp_dim": 96, "num_classes": 3}))
    model = create_model(path)
    assert model.config.width == 48 and model.config.num_classes == 3


@pytest.mark.parametrize(("name", "width", "depth", "heads", "patch"), [
    ("Ti/16", 192, 12, 3, 16), ("S/32", 384, 12, 6, 32), ("B/16", 768, 12, 12, 16),
    ("L/16", 1024, 24, 16, 16), ("H/14", 1280, 32, 16, 14), ("B/8", 768, 12, 12, 8),
    ("ViT-B_16", 768, 12, 12, 16), ("vit-l/32", 1024, 24, 16, 32), ("Ti/4", 192, 12, 3, 4),
    ("vit_small_patch16_224", 384, 12, 6, 16),
])
def test_variant_names_parse(name, width, depth, heads, patch):
    config = variant_config(name)
    assert (config.width, config.depth, config.num_heads, config.patch_size) == \
        (width, depth, heads, patch)
    assert config.mlp_dim == 4 * width


def test_keyword_overrides():
    model = create_model("B/16", num_classes=10, img_size=384, device="meta")
    assert model.config.img_size == (384, 384) and model.config.num_classes == 10
    assert model.pos_embed.shape == (1, 577, 768)


@pytest.mark.parametrize("name", ["Ti/16", "B/16", "R50+B/16", "cifar10-tutorial",
                                  "t2t-tutorial"])
def test_a_model_with_its_variants_sizes_is_called_by_its_name(name, capsys):
    from vitkit.catalog import model_name, variant_of

    config = variant_config(name, img_size=64 if name != "t2t-tutorial" else (400, 100),
                            num_classes=7)
    assert variant_of(config) == model_name(config) == name
    if "tutorial" not in name:  # a paper variant is found from the sizes alone
        assert variant_of(config.replace(name="")) == name
    assert main(["summary", name]) in (0, None)
    assert capsys.readouterr().out.startswith(f"{name}: image")


def test_a_variant_with_other_sizes_is_described_by_its_numbers(capsys):
    """The digits recipe: "Ti/2" with width 64, depth 4 is not ViT-Ti (192 wide, 12 deep)."""
    from vitkit.catalog import model_name, variant_of

    digits = variant_config("Ti/2", img_size=8, in_chans=1, num_classes=10, width=64, depth=4,
                            num_heads=4, mlp_dim=128)
    assert digits.name == "Ti/2" and variant_of(digits) == ""
    assert model_name(digits) == "custom ViT (width 64, depth 4, heads 4, MLP 128, patch 2)"
    assert main(["summary", "Ti/2", "--img-size", "8", "--set", "width=64", "--set", "depth=4",
                 "--set", "num_heads=4", "--set", "mlp_dim=128"]) in (0, None)
    first = capsys.readouterr().out.splitlines()[0]
    assert first.startswith("custom ViT: image 8x8x3") and "Ti" not in first


def test_every_listed_name_builds():
    for name in list_model_names():
        assert variant_config(name).depth > 0


def test_unknown_variant_suggests_close_names():
    """An unknown model name is refused, naming it and close names that build."""
    with pytest.raises(ConfigError) as refused:
        variant_config("B/16x")
    says(refused.value, "unknown model", "B/16x", "'B/16'")
    assert variant_config("B/16").width == 768
    with pytest.raises(ConfigError) as refused:
        variant_config("Q/16")
    says(refused.value, "Q/16", "'B/16'")
    with pytest.raises(ConfigError, match="cifar10-tutorial"):
        variant_config("cifar-tutorial")
    assert variant_config("cifar10-tutorial").depth > 0


def test_width_not_divisible_by_heads_names_valid_head_counts():
    with pytest.raises(ConfigError) as refused:
        ViTConfig(num_heads=7)
    says(refused.value, "width 768", "num_heads 7")
    offered = re.search(r"\[([\d, ]+)\]", str(refused.value)).group(1)
    assert "8" in offered.split(", ")
    for heads in offered.split(", "):  # each head count offered is taken
        assert ViTConfig(num_heads=int(heads)).num_heads == int(heads)


def test_image_not_divisible_by_patch_suggests_a_size():
    with pytest.raises(ConfigError) as refused:
        ViTConfig(img_size=225)
    says(refused.value, "225x225", "patch size 16", "224x224")
    assert ViTConfig(img_size=224).img_size == (224, 224)


def test_unknown_config_keys_are_refused_with_a_hint(tmp_path):
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"widht": 64, "depth": 2}))
    with pytest.raises(ConfigError) as refused:
        ViTConfig.from_json(path)
    says(refused.value, "unknown config key", "widht", "'width'")
    path.write_text(json.dumps({"width": 64, "depth": 2, "num_heads": 4}))
    assert ViTConfig.from_json(path).width == 64
    with pytest.raises(ConfigError, match="unknown config key"):
        create_model("B/16", embed_dim=64)


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"pool": "gap"}, ("pool='gap'", "mean_patches")),
    ({"class_token": False}, ("class_token=True", "pool='mean_patches'")),
    ({"pos_embed": "sincos2d", "width": 66, "num_heads": 3}, ("divisible by 4",)),
    ({"dropout": 1.5}, ("dropout", "[0, 1)", "1.5")),
])
def test_inconsistent_options_are_refused(kwargs, message):
    with pytest.raises(ConfigError) as refused:
        ViTConfig(**kwargs)
    says(refused.value, *message)


def test_resolution_schedule_must_start_at_zero_and_increase():
    from vitkit.train.config import load_train_config

    assert load_train_config("digits", ["resolution_schedule=[[0, 4], [0.5, 8]]"])
    with pytest.raises(ConfigError) as refused:
        load_train_config("digits", ["resolution_schedule=[[0.2, 4], [0.5, 8]]"])
    says(refused.value, "resolution_schedule", "fraction 0")


def test_image_smaller_than_the_patch_is_refused_and_the_advice_works():
    with pytest.raises(ConfigError) as refused:
        ViTConfig(img_size=8)
    says(refused.value, "8x8", "patch size 16", "at least 16x16")
    assert ViTConfig(img_size=16).num_patches == 1


def test_named_checkpoints_imply_their_config():
    from vitkit.weights.formats.hub import named_checkpoint_config

    # SPEC: ImageNet-21k checkpoints keep the pre-logits layer; i21k-i1k are fine-tuned at 384
    # (or 224 where named) with a 1000-way head; the official port uses tanh GELU, eps 1e-6.
    i21k = named_checkpoint_config("ViT-B_16-i21k")
    assert (i21k.num_classes, i21k.pre_logits_dim, i21k.img_size) == (21843, 768, (224, 224))
    assert (i21k.act, i21k.norm_eps) == ("gelu_tanh", 1e-6)
    hybrid = named_checkpoint_config("R50+B/16-i21k")
    assert hybrid.stem == "resnet" and hybrid.resnet_layers == (3, 4, 9)
    tuned = named_checkpoint_config("L/16-i21k-i1k-224")
    assert (tuned.num_classes, tuned.pre_logits_dim, tuned.img_size, tuned.width) == \
        (1000, 0, (224, 224), 1024)
    assert named_checkpoint_config("B/16-i21k-i1k-384").img_size == (384, 384)
    assert named_checkpoint_config("B/16") is None


def test_config_of_reads_names_json_and_checkpoints(tmp_path):
    from vitkit import save_pretrained
    from vitkit.catalog import config_of

    assert config_of("S/16", img_size=32).img_size == (32, 32)
    path = tmp_path / "tiny.json"
    ViTConfig(img_size=32, patch_size=4, width=48, depth=1, num_heads=4, mlp_dim=96).to_json(path)
    assert config_of(path).width == 48
    folder = save_pretrained(create_model(path, num_classes=3), tmp_path / "weights")
    assert config_of(folder) == ViTConfig.from_json(path).replace(num_classes=3)
    with pytest.raises(ConfigError) as refused:
        config_of(tmp_path / "missing.json")
    says(refused.value, "missing.json", "does not exist")


def test_an_invalid_json_config_names_its_file(tmp_path, capsys):
    """A config file that is not valid JSON is refused naming the file (create_model and
    `summary`); one that is not an object is refused too, and a valid file builds."""
    from vitkit.cli import main

    path = tmp_path / "mine.json"
    path.write_text('{"width": 48,')
    with pytest.raises(ConfigError) as refused:
        create_model(str(path))
    says(refused.value, str(path), "not valid JSON")
    assert main(["summary", str(path)]) == 2
    says(capsys.readouterr().err, str(path), "not valid JSON")
    path.write_text("[1, 2]")
    with pytest.raises(ConfigError) as refused:
        ViTConfig.from_json(path)
    says(refused.value, str(path), "JSON object")
    path.write_text(variant_config("cifar10-tutorial").to_json())
    assert create_model(str(path)).config == variant_config("cifar10-tutorial")


@pytest.mark.parametrize(("theirs", "ours", "value"), [
    ("embed_dim", "width", 384), ("drop_rate", "dropout", 0.1), ("hidden_size", "width", 384),
    ("num_hidden_layers", "depth", 2), ("drop_path_rate", "drop_path", 0.1),
    ("in_channels", "in_chans", 1), ("layer_norm_eps", "norm_eps", 1e-5)])
def test_timm_and_hf_names_of_fields_name_the_field(theirs, ours, value):
    """timm's and Hugging Face's keyword names are refused naming vitkit's field for them
    (not the nearest spelling), and that field builds the model with the setting."""
    with pytest.raises(ConfigError) as refused:
        create_model("S/16", device="meta", **{theirs: value})
    says(refused.value, theirs, f"use {ours}")
    assert getattr(create_model("S/16", device="meta", **{ours: value}).config, ours) == value
    with pytest.raises(ConfigError) as refused:
        create_model("S/16", device="meta", pretrained=True)
    says(refused.value, "pretrained", "load_pretrained(NAME)")


def test_suggested_patch_sizes_are_ones_the_stem_takes():
    """A conv stem's patch is a power of 2: at 30 px it is offered only patch sizes it
    takes (patch 2), and with no such size the message says to resize the images."""
    conv = dict(stem="conv", stem_channels=(16, 32, 64), width=64, num_heads=2, mlp_dim=64,
                depth=1)
    with pytest.raises(ConfigError, match=r"\(patch_size 2 for 30x30\)") as refused:
        ViTConfig(img_size=30, patch_size=8, **conv)
    suggested = re.search(r"patch_size ([\d, or]+) for", str(refused.value)).group(1)
    for patch in re.findall(r"\d+", suggested):
        ViTConfig(img_size=30, patch_size=int(patch), **conv)  # each one is taken
    with pytest.raises(ConfigError) as refused:
        ViTConfig(img_size=100, patch_size=16, stem="resnet", resnet_layers=(3, 4, 9))
    says(refused.value, "100x100", "none above 1", "resize")


QUICK = ["epochs=1", "warmup_epochs=0", "train_limit=256", "test_limit=200", "progress=false"]


def test_a_patch_size_that_does_not_divide_the_images_names_those_that_do(tmp_path, capsys):
    assert main(["train", *QUICK, "model.patch_size=3", "--out", str(tmp_path / "r0")]) == 2
    err = capsys.readouterr().err
    says(err, "8x8", "patch size 3", "9x9", "patch_size 2, 4 or 8")
    assert main(["train", *QUICK, "model.patch_size=4", "--out", str(tmp_path / "r1")]) == 0


@pytest.mark.parametrize("eps", [-1.0, 0.0, 2.0])
def test_a_norm_eps_that_is_not_small_and_positive_is_refused(eps):
    """A norm_eps of 0, below 0 or large is refused, naming the value and usual ones."""
    with pytest.raises(ConfigError) as refused:
        create_model("cifar10-tutorial", norm_eps=eps)
    says(refused.value, "norm_eps", "small positive", f"got {eps}", "1e-6")

    assert create_model("cifar10-tutorial", norm_eps=1e-6).config.norm_eps == 1e-6
