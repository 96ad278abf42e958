"""Values are typed by the field they set, the same way from the CLI, JSON files and Python:
"False" is false, "60x100" is an image size, and anything else names the key, the value and
the type, with an example that works. Training settings are KEY=VALUE: one written as a flag
(`--total-steps 2`) or as two words (`total_steps 2`) gets that advice, and it works."""

import json
import re
from pathlib import Path

import pytest
import torch

from vitkit import ConfigError, ViTConfig, create_model
from vitkit.cli import main
from vitkit.data.augment import AugmentConfig, BatchAugment, normalize
from vitkit.fieldtypes import parse_size, parse_text
from vitkit.train.config import TrainConfig, load_train_config

B16_PARAMS = 86_567_656  # SPEC: ViT-B/16 at 224, 1000 classes


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"


def _example(message: str) -> str:
    """The `KEY=VALUE` a type error suggests ("...; for example depth=12 ...")."""
    match = re.search(r"for example (\S+=\S+)", message)
    assert match, message
    return match.group(1)


@pytest.mark.parametrize(("word", "value"), [
    ("true", True), ("True", True), ("TRUE", True), ("1", True), ("yes", True),
    ("false", False), ("False", False), ("0", False), ("no", False), (" No ", False),
])
def test_boolean_words(word, value):
    assert parse_text(ViTConfig, "qkv_bias", word) is value


def test_false_switches_off_what_it_names():
    cfg = load_train_config("digits", ["model.qkv_bias=False", "model.class_token=False",
                                       "model.pool=mean_patches", "augment.flip=False",
                                       "augment.crop_padding=0"])
    model = create_model(cfg.model_config())
    assert model.cls_token is None
    assert all(block.attn.qkv.bias is None for block in model.blocks)
    # Flipping off: every image comes out as it went in, whatever the random draws.
    images = torch.arange(4 * 8 * 8, dtype=torch.uint8).reshape(4, 1, 8, 8)
    augment = BatchAugment(AugmentConfig(**cfg.augment), 10)
    for seed in range(5):
        out, _ = augment(images, torch.zeros(4, dtype=torch.long),
                         torch.Generator().manual_seed(seed), (0.5,), (0.5,))
        assert torch.equal(out, normalize(images, (0.5,), (0.5,)))
    # ... and on (the default), some are flipped.
    flipping = BatchAugment(AugmentConfig(crop_padding=0), 10)
    out, _ = flipping(images, torch.zeros(4, dtype=torch.long), torch.Generator().manual_seed(0),
                      (0.5,), (0.5,))
    assert not torch.equal(out, normalize(images, (0.5,), (0.5,)))


def test_cli_set_false_removes_the_qkv_bias(capsys):
    assert main(["summary", "B/16", "--set", "qkv_bias=False"]) == 0
    fewer = 12 * 3 * 768  # one bias of 3 x 768 per block
    assert f"{B16_PARAMS - fewer:,}" in capsys.readouterr().out


@pytest.mark.parametrize(("text", "size"), [
    ("224", (224, 224)), ("60x100", (60, 100)), ("60X100", (60, 100)), ("60,100", (60, 100)),
    ("[60, 100]", (60, 100)), (" 16x16 ", (16, 16)),
])
def test_sizes_parse(text, size):
    assert parse_size(text) == size
    assert parse_text(ViTConfig, "img_size", text) == size


def test_sizes_work_wherever_the_cli_takes_them(capsys, tmp_path):
    assert load_train_config("digits", ["model.img_size=16x16"]).model_config().img_size == \
        (16, 16)
    # 60x100 at patch 20: 3 x 5 patches + the class token.
    assert main(["summary", "S/20", "--set", "img_size=60x100"]) == 0
    assert "(1, 16, 384)" in capsys.readouterr().out
    assert main(["summary", "S/20", "--set", "model.img_size=60x100"]) == 0  # train's spelling
    assert "(1, 16, 384)" in capsys.readouterr().out
    # A size that is valid end to end: the digits are 8x8.
    assert main(["train", "digits", "model.img_size=8x8", "total_steps=2", "progress=false",
                 "--out", str(tmp_path)]) == 0


@pytest.mark.parametrize(("override", "key", "kind"), [
    ("epochs=five", "epochs", "a number"),
    ("lr=abc", "lr", "a number"),
    ("model.depth=two", "model.depth", "an integer"),
    ("model.depth=4.5", "model.depth", "an integer"),
    ("model.img_size=big", "model.img_size", "an image size"),
    ("model.qkv_bias=maybe", "model.qkv_bias", "true or false"),
    ("augment.flip=nope", "augment.flip", "true or false"),
    ("progress=2", "progress", "true or false"),
    ("betas=[0.9]", "betas", "a list of 2 numbers"),
    ("threads=many", "threads", "an integer or null"),
    ("lr=nan", "lr", "a number"),
])
def test_badly_typed_overrides_name_key_value_type_and_the_example_works(override, key, kind):
    with pytest.raises(ConfigError) as info:
        load_train_config("digits", [override])
    message = str(info.value)
    value = override.split("=", 1)[1]
    says(message, f"{key}={value!r}", "not valid", kind)
    fixed = _example(message)
    assert fixed.startswith(f"{key}=")
    load_train_config("digits", [fixed])  # the suggested value is accepted


@pytest.mark.parametrize("override", ["epochs=five", "lr=abc", "model.depth=two",
                                      "model.img_size=16x16y"])
def test_cli_type_errors_are_one_line_not_a_traceback(override, capsys, tmp_path):
    assert main(["train", "digits", override, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vitkit train: error: ") and "is not valid" in err
    assert "Traceback" not in err and not (tmp_path / "last.pt").exists()


def test_json_configs_are_checked_by_the_same_types(tmp_path):
    path = tmp_path / "model.json"
    for key, bad, good in (("depth", "two", 2), ("qkv_bias", "no", False),
                           ("img_size", [16, "x"], "16x32")):
        path.write_text(json.dumps({key: bad, "patch_size": 16}))
        with pytest.raises(ConfigError) as refused:
            ViTConfig.from_json(path)
        says(refused.value, f"{key}={bad!r}", "not valid")
        path.write_text(json.dumps({key: good, "patch_size": 16}))
        config = ViTConfig.from_json(path)
        assert getattr(config, key) == (good if key != "img_size" else (16, 32))


def test_recipe_files_are_checked_by_the_same_types(tmp_path):
    recipe = tmp_path / "recipe.json"
    recipe.write_text(json.dumps({"epochs": "five", "model": "Ti/4"}))
    with pytest.raises(ConfigError) as refused:
        load_train_config(str(recipe))
    says(refused.value, "epochs='five'", "a number", "for example")
    recipe.write_text(json.dumps({"model": {"variant": "Ti/4", "qkv_bias": "no"}}))
    with pytest.raises(ConfigError) as refused:
        load_train_config(str(recipe))
    says(refused.value, "model.qkv_bias='no'", "true or false")
    recipe.write_text(json.dumps({"augment": {"flip": "no"}}))
    with pytest.raises(ConfigError, match=r"augment.flip='no' is not valid"):
        load_train_config(str(recipe))
    recipe.write_text(json.dumps({"model": {"variant": "Ti/4", "qkv_bias": False},
                                  "augment": {"flip": False}}))
    cfg = load_train_config(str(recipe))
    assert cfg.model["qkv_bias"] is False and cfg.augment["flip"] is False


def test_python_api_uses_the_same_check():
    with pytest.raises(ConfigError) as refused:
        ViTConfig(depth="two")
    says(refused.value, "depth='two'", "an integer")
    with pytest.raises(ConfigError, match=r"qkv_bias='no' is not valid"):
        ViTConfig(qkv_bias="no")
    with pytest.raises(ConfigError, match=r"epochs='five' is not valid"):
        TrainConfig(epochs="five")
    # Lossless conversions are made: a list to a tuple, 4.0 to 4, 0/1 to a bool, HxW text.
    config = ViTConfig(depth=4.0, qkv_bias=0, img_size="60x100", patch_size=20,
                       stem_channels=[8])
    assert config.depth == 4 and isinstance(config.depth, int) and config.qkv_bias is False
    assert config.img_size == (60, 100) and config.stem_channels == (8,)
    assert ViTConfig(img_size=[60, 100], patch_size=20) == config.replace(depth=12,
                                                                          qkv_bias=True,
                                                                          stem_channels=())


def test_json_quoted_and_null_values_from_the_cli():
    cfg = load_train_config("digits", ['out_dir="runs/a b"', "data_dir=null", "threads=none",
                                       "ema_decay=null", "mean=0.4", "std=0.2", "epochs=3"])
    assert cfg.out_dir == "runs/a b" and cfg.data_dir is None and cfg.threads is None
    assert cfg.ema_decay is None and cfg.mean == (0.4,) and cfg.std == (0.2,)
    assert cfg.epochs == 3


def test_unknown_nested_keys_say_which_keys_nest():
    with pytest.raises(ConfigError) as refused:
        load_train_config("digits", ["optim.lr=0.1"])
    says(refused.value, "optim.lr", "model", "augment", "no dots")
    assert load_train_config("digits", ["lr=0.1"]).lr == 0.1  # a top-level key: no dots
    with pytest.raises(ConfigError) as refused:
        load_train_config("digits", ["model.widht=8"])
    says(refused.value, "unknown model key", "widht", "'width'")
    assert load_train_config("digits", ["model.width=8"]).model["width"] == 8


def _train_and_follow(argv: list[str], tmp_path: Path, capsys) -> str:
    """Run `vitkit train ARGV` (refused), then its advice, total_steps=2; the refusal's text."""
    out = ["--out", str(tmp_path / "run"), "progress=false", "model.depth=1"]
    try:
        code = main(["train", *argv, *out])
    except SystemExit as exit_info:  # argparse refuses a flag
        code = exit_info.code
    err = capsys.readouterr().err
    assert code == 2, err
    says(err, "KEY=VALUE", "total_steps=2")
    assert main(["train", "total_steps=2", *out]) == 0  # the advice, followed
    assert (tmp_path / "run" / "last.pt").exists()
    return err


@pytest.mark.parametrize("flag", [["--total-steps", "2"], ["--total_steps=2"]])
def test_a_training_setting_as_a_flag_suggests_key_value(flag, tmp_path, capsys):
    err = _train_and_follow(flag, tmp_path, capsys)
    says(err, f"unrecognized argument {flag[0].split('=')[0]}", "training settings")
    assert "usage: vitkit train" in err  # the verb's usage, not the top level's


def test_a_training_setting_as_two_words_suggests_key_value(tmp_path, capsys):
    err = _train_and_follow(["total_steps", "2"], tmp_path, capsys)
    assert "'total_steps' is no recipe" in err and "no recipe file" not in err


def test_finetune_settings_as_flags_get_the_same_advice(digits_run, tmp_path, capsys):
    weights = str(digits_run)
    with pytest.raises(SystemExit):
        main(["finetune", weights, "--total-steps", "1", "--out", str(tmp_path / "ft")])
    err = capsys.readouterr().err
    says(err, "--total-steps", "KEY=VALUE", "total_steps=1", "usage: vitkit finetune")
    assert main(["finetune", weights, "total_steps=1", "warmup_steps=0", "data=digits",
                 "progress=false",
                 "--out", str(tmp_path / "ft")]) == 0


def test_a_recipe_word_that_is_a_setting_without_a_value(capsys, tmp_path):
    assert main(["train", "digits", "epochs", "--out", str(tmp_path)]) == 2
    says(capsys.readouterr().err, "'epochs'", "KEY=VALUE", "epochs=")

