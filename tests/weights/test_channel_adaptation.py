"""Weights for RGB images adapt to other channel counts as timm's `adapt_input_conv` does
(logits within 1e-5 of timm's adapted model): a one-channel image gives what its RGB copy
gives, a conv stem adapts the convolution that reads the image, and fine-tuning RGB weights
on one-channel data follows the advice it is given."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

import vitkit
from vitkit.cli import main

timm = pytest.importorskip("timm")


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
