"""timm and Hugging Face weights whose files leave something open or hold a layout vitkit
did not read: each is read as its library runs it (logits within 1e-5 of timm's or
Hugging Face's), refused by name, or refused with advice that works when followed.

- timm: a head count other than the width's standard one (timm's
  vit_base_patch16_gap_224 has 16 heads at width 768) is read from a config.json (its
  model_args, else its architecture); a bare file says what it assumed; a width with no
  standard count gives a command-line way that works. A class token with a square grid of
  positions and no row for it (timm's no_embed_class) is named in the refusal (shapes alone
  cannot tell it from a non-square grid and the class token's row).
- Hugging Face: problem_type regression / multi_label_classification are their tasks, not
  softmax classes; a folder split into shards loads.
- Weights for RGB images adapt to other channel counts as timm's adapt_input_conv does, so
  fine-tuning RGB weights on one-channel data follows the advice it is given.
"""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image
from safetensors.torch import save_file

import vitkit
from vitkit.cli import main
from vitkit.errors import CheckpointError
from vitkit.export.report import default_output_path
from vitkit.tasks import task_of

timm = pytest.importorskip("timm")
transformers = pytest.importorskip("transformers")

ATOL = 1e-5


def _timm(name: str, **kwargs) -> torch.nn.Module:
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, **kwargs).eval()
    with torch.no_grad():  # away from the zero-initialised head and the default init
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.05)
    return model


def _save(model: torch.nn.Module, path: Path) -> Path:
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(path))
    return path


def _close(ours: torch.nn.Module, theirs: torch.nn.Module, x: torch.Tensor) -> float:
    with torch.no_grad():
        return float((ours.eval()(x) - theirs(x)).abs().max())


# -- timm: heads --------------------------------------------------------------------------
def test_timm_heads_come_from_the_config_not_the_width(tmp_path: Path, caplog) -> None:
    from timm.models import save_for_hf

    gap = _timm("vit_base_patch16_gap_224", depth=2, img_size=64)
    x = torch.randn(2, 3, 64, 64)
    save_for_hf(gap, str(tmp_path / "gap"))  # config.json: architecture and model_args
    folder = vitkit.load_pretrained(tmp_path / "gap")
    assert folder.config.num_heads == 16 and _close(folder, gap, x) < ATOL

    file = _save(gap, tmp_path / "gap.safetensors")  # a bare file cannot tell
    with caplog.at_level(logging.INFO, logger="vitkit"):
        guessed = vitkit.load_pretrained(file)
    assert guessed.config.num_heads == 12 and _close(guessed, gap, x) > 1e-2
    assert "and 12 heads, the standard count for width 768 (a model with others, such as " \
        "timm's vit_base_patch16_gap_224 with 16, needs load_pretrained(path, " \
        "num_heads=N))" in caplog.text
    told = vitkit.load_pretrained(file, num_heads=16)  # what the note says
    assert _close(told, gap, x) < ATOL

    args_only = tmp_path / "args"  # model_args.num_heads alone, no architecture timm knows
    args_only.mkdir()
    weights = next(p for p in (tmp_path / "gap").iterdir() if p.name != "config.json")
    weights.rename(args_only / weights.name)
    meta = json.loads((tmp_path / "gap" / "config.json").read_text())
    meta.update(architecture="my_own_vit", model_args={**meta["model_args"], "num_heads": 16})
    (args_only / "config.json").write_text(json.dumps(meta))
    assert _close(vitkit.load_pretrained(args_only), gap, x) < ATOL


def test_a_width_with_no_standard_head_count_gives_a_command_line_way_that_works(
        tmp_path: Path, capsys) -> None:
    from timm.models.vision_transformer import VisionTransformer

    torch.manual_seed(0)
    theirs = VisionTransformer(img_size=32, patch_size=8, embed_dim=64, depth=2, num_heads=4,
                               num_classes=7).eval()
    file = _save(theirs, tmp_path / "w64.safetensors")
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(tmp_path / "x.png")
    assert main(["predict", str(file), str(tmp_path / "x.png")]) != 0
    err = capsys.readouterr().err
    assert "width 64 is not a standard ViT width, so the number of heads cannot be inferred " \
        "from the tensors: pass num_heads=N: load_pretrained(" in err
    command = re.search(r'python -c "(.+?)" and give FOLDER', err)[1]
    folder = tmp_path / "converted"
    code = command.replace("num_heads=N", "num_heads=4").replace("'FOLDER'", repr(str(folder)))
    subprocess.run([sys.executable, "-c", code], check=True, cwd=tmp_path)
    assert main(["predict", str(folder), str(tmp_path / "x.png")]) == 0
    assert _close(vitkit.load_pretrained(folder), theirs, torch.randn(2, 3, 32, 32)) < ATOL


# -- timm: positions without a class-token row -------------------------------------------
def test_positions_with_no_row_for_the_class_token_are_refused_by_name(tmp_path: Path) -> None:
    plain = _timm("vit_tiny_patch16_224", depth=1, img_size=64)  # 1 + 4x4 rows
    state = {k: v.contiguous() for k, v in plain.state_dict().items()}
    assert vitkit.load_pretrained(_save(plain, tmp_path / "plain.safetensors"))
    state["pos_embed"] = state["pos_embed"][:, 1:].contiguous()  # no_embed_class: 4x4 rows
    save_file(state, str(tmp_path / "no_class_row.safetensors"))
    with pytest.raises(CheckpointError) as refused:
        vitkit.load_pretrained(tmp_path / "no_class_row.safetensors")
    assert "15 position embeddings do not form a square grid" in str(refused.value)
    assert str(refused.value).endswith(
        ". Or, if the file is timm's no_embed_class layout (16 rows = a 4x4 grid with no row "
        "for the class token: FlexiViT, DeiT III), vitkit cannot read it: its ViT adds a "
        "position to the class token, as the paper's does, and would read the table shifted "
        "by one row.")


# -- Hugging Face: tasks and shards ------------------------------------------------------
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
    assert torch.allclose(values, _hf_logits(regression, x), atol=ATOL)

    multi = _hf(tmp_path, "multi", num_labels=5, problem_type="multi_label_classification")
    ours = vitkit.load_pretrained(tmp_path / "multi")
    assert task_of(ours).spec.kind == "multilabel"
    with torch.no_grad():
        assert torch.allclose(ours(x), _hf_logits(multi, x), atol=ATOL)
    Image.fromarray(np.full((32, 32, 3), 90, np.uint8)).save(tmp_path / "x.png")
    assert main(["predict", str(tmp_path / "reg"), str(tmp_path / "x.png")]) == 0
    assert re.search(r"x\.png: age=-?\d", capsys.readouterr().out)

    _hf(tmp_path, "odd", num_labels=2)
    meta = json.loads((tmp_path / "odd" / "config.json").read_text())
    (tmp_path / "odd" / "config.json").write_text(json.dumps({**meta, "problem_type": "rank"}))
    with pytest.raises(CheckpointError, match="'problem_type' is 'rank', not one of "
                                              "single_label_classification, regression"):
        vitkit.load_pretrained(tmp_path / "odd")


def test_a_hugging_face_folder_split_into_shards_loads(tmp_path: Path) -> None:
    model = _hf(tmp_path, "whole", num_labels=3)
    model.save_pretrained(str(tmp_path / "sharded"), max_shard_size="100KB")
    shards = sorted(p.name for p in (tmp_path / "sharded").glob("model-*.safetensors"))
    assert len(shards) > 1 and (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.allclose(vitkit.load_pretrained(tmp_path / "sharded")(x),
                              _hf_logits(model, x), atol=ATOL)
    (tmp_path / "sharded" / shards[-1]).unlink()
    with pytest.raises(CheckpointError, match=f"names the shard '{shards[-1]}', which is not a "
                                              "file in .*download or copy the whole folder"):
        vitkit.load_pretrained(tmp_path / "sharded")


def test_a_hub_repository_exports_to_a_file_name_every_system_takes() -> None:
    assert default_output_path("hf-hub:me/tiny-vit") == Path("me-tiny-vit.onnx")
    assert default_output_path("hf-hub:me/tiny-vit@v1", int8=True) == \
        Path("me-tiny-vit-v1.int8.onnx")
    assert default_output_path("B/16-i21k") == Path("B-16-i21k.onnx")


# -- RGB weights on other channel counts -------------------------------------------------
@pytest.mark.parametrize("channels", [1, 6])
def test_rgb_weights_adapt_to_other_channel_counts_as_timm_does(tmp_path: Path,
                                                                channels: int) -> None:
    theirs = _timm("vit_tiny_patch16_224", depth=1, img_size=32, in_chans=channels)
    rgb = _timm("vit_tiny_patch16_224", depth=1, img_size=32)
    file = _save(rgb, tmp_path / "rgb.safetensors")
    ours = vitkit.load_pretrained(file, in_chans=channels)
    from timm.models import adapt_input_conv

    adapted = dict(rgb.state_dict())
    adapted["patch_embed.proj.weight"] = adapt_input_conv(channels,
                                                          adapted["patch_embed.proj.weight"])
    theirs.load_state_dict(adapted)
    x = torch.randn(2, channels, 32, 32)
    assert _close(ours, theirs, x) < ATOL
    assert len(ours.preprocess.mean) == channels
    gray = torch.randn(2, 1, 32, 32)  # one channel: a gray image gives what its RGB copy gives
    if channels == 1:
        with torch.no_grad():
            assert torch.allclose(ours(gray), rgb(gray.expand(-1, 3, -1, -1)), atol=ATOL)


def test_fine_tuning_rgb_weights_on_one_channel_data_follows_its_advice(tmp_path: Path,
                                                                         capsys) -> None:
    file = _save(_timm("vit_tiny_patch16_224", depth=1, num_classes=10), tmp_path / "ti.pth")
    quick = ["total_steps=2", "warmup_steps=1", "batch_size=8", "accum_steps=1",
             "train_limit=32", "test_limit=16", "progress=false", "--img-size", "32"]
    assert main(["finetune", str(file), "--data", "digits", *quick, "--out",
                 str(tmp_path / "a")]) != 0
    err = capsys.readouterr().err
    assert "the data has 1 channel(s) but the model takes 3: set model.in_chans=1; the " \
        "pretrained input convolution is then adapted to it" in err
    advice = re.search(r"set (model\.in_chans=\d+)", err)[1]
    assert main(["finetune", str(file), advice, "--data", "digits", *quick, "--out",
                 str(tmp_path / "b")]) == 0
    tuned = vitkit.load_pretrained(tmp_path / "b")
    assert tuned.config.in_chans == 1 and len(tuned.preprocess.mean) == 1


def test_a_conv_stem_adapts_its_first_convolution_and_keeps_one_mean(tmp_path: Path) -> None:
    """A conv stem's proj is its 1x1 projection: the convolution that reads the image is its
    first; a recorded mean and std of one value stand for all three channels."""
    from vitkit.preprocess import Preprocess

    torch.manual_seed(0)
    model = vitkit.create_model({"img_size": 16, "patch_size": 4, "width": 16, "depth": 1,
                                 "num_heads": 2, "mlp_dim": 32, "num_classes": 3,
                                 "stem": "conv", "stem_channels": [8, 8]}).eval()
    model.preprocess = Preprocess(img_size=(16, 16), mean=(0.5,), std=(0.25,))
    vitkit.save_pretrained(model, tmp_path / "conv")
    gray = vitkit.load_pretrained(tmp_path / "conv", in_chans=1).eval()
    assert gray.preprocess.mean == (0.5,) and gray.preprocess.std == (0.25,)
    x = torch.randn(2, 1, 16, 16)
    with torch.no_grad():
        assert torch.allclose(gray(x), model(x.expand(-1, 3, -1, -1)), atol=ATOL)
