"""timm files read as timm runs them (logits within 1e-5 of timm's own model), or refused
by name with advice that works when followed.

What a bare state dict leaves open is read from a config.json when there is one (the head
count: its model_args, else its architecture) and otherwise said in the log with the
argument that settles it (the head count, the pooling). timm's hybrids keep timm's own
normalisation constants (GroupNorm eps 1e-5, weight standardisation eps 1e-8 inside the
square root), also through vitkit's folder; an official .npz cannot record them and says so.
A position table with no row for the class token (timm's no_embed_class) is refused by name."""

from __future__ import annotations

import json
import logging
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

import vitkit
from vitkit.cli import main
from vitkit.errors import CheckpointError
from vitkit.weights import save_npz

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


def test_a_bare_timm_file_says_how_its_pooling_was_read_and_the_advice_works(tmp_path, caplog):
    reference = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=3,
                                  global_pool="avg", fc_norm=False).eval()
    path = tmp_path / "avg.safetensors"
    save_file(reference.state_dict(), path)
    images = torch.randn(2, 3, 32, 32)
    with caplog.at_level(logging.INFO):
        guessed = vitkit.load_pretrained(path)
    assert "pooled as timm's global_pool='token' (timm's default without fc_norm; a model " \
        "built with 'avg' needs load_pretrained(path, global_pool='avg'))" in caplog.text
    with torch.no_grad():
        assert (guessed(images) - reference(images)).abs().max() > 1e-2
        followed = vitkit.load_pretrained(path, global_pool="avg")
        assert (followed(images) - reference(images)).abs().max() <= ATOL


@pytest.mark.parametrize("timm_name", ["vit_small_r26_s32_224", "vit_base_r50_s16_224"])
def test_timm_hybrid_files_give_timms_own_logits(tmp_path, timm_name):
    """timm's hybrids standardise weights with eps 1e-8 inside the square root and use
    GroupNorm eps 1e-5; the official code (which vitkit's .npz path follows) 1e-5 outside it
    and 1e-6. Computed with the official constants, timm files would be 1e-3 to 1e-2 off."""
    torch.manual_seed(0)
    reference = timm.create_model(timm_name, img_size=64, embed_dim=192, depth=1, num_heads=3,
                                  num_classes=5).eval()
    with torch.no_grad():  # weights far from a fresh init, where the constants matter
        for param in reference.parameters():
            param.add_(0.05 * torch.randn_like(param))
    path = tmp_path / "hybrid.safetensors"
    save_file(reference.state_dict(), path)
    model = vitkit.load_pretrained(path)
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():
        assert (model(images) - reference(images)).abs().max() <= ATOL
    assert model.config.resnet_norm == "timm"
    folder = vitkit.save_pretrained(model, tmp_path / "saved")  # the convention travels
    with torch.no_grad():
        assert torch.equal(vitkit.load_pretrained(folder)(images), model(images))


def test_an_official_npz_of_a_timm_hybrid_warns_that_it_reads_back_otherwise(tmp_path, caplog):
    reference = timm.create_model("vit_tiny_r_s16_p8_224", img_size=64, depth=1,
                                  num_classes=5).eval()
    save_file(reference.state_dict(), tmp_path / "hybrid.safetensors")
    model = vitkit.load_pretrained(tmp_path / "hybrid.safetensors")
    with caplog.at_level(logging.WARNING):
        save_npz(model, tmp_path / "hybrid.npz")
    assert "which an official .npz cannot record: read back, it uses the official ones" \
        in caplog.text
    assert vitkit.load_pretrained(tmp_path / "hybrid.npz").config.resnet_norm == "official"
