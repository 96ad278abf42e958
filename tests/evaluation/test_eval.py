"""`vitkit eval` reads every weights format on disk, and a run's best.pt reproduces the score
that picked it (EMA on: the checkpoint holds the weights that scored).

One small ViT is trained on the embedded digits with EMA; its best weights are then written
in every format and evaluated through the CLI. References are independent: the score the run
recorded, and the accuracy timm's and Hugging Face's own models reach with the same weights.
Tolerance: top-1 equal within 1e-6 (the same images, the same predictions).
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest
import timm.models.vision_transformer as timm_vit
import torch
import torch.nn.functional as F
from PIL import Image
from safetensors.torch import save_file
from transformers import ViTConfig as HFConfig
from transformers import ViTForImageClassification

from vitkit.catalog import load_pretrained, read_weights
from vitkit.cli import main
from vitkit.data.sources import open_source
from vitkit.evaluation import evaluate_checkpoint
from vitkit.train.checkpoint import load_state
from vitkit.train.config import load_train_config
from vitkit.train.loop import run_loop
from vitkit.train.setup import build_run
from vitkit.weights import ORIGINS, save_npz, save_pretrained

# Two epochs on the digits; with this EMA the average scores better than the raw weights at
# both evaluations (0.86 vs 0.78, 0.93 vs 0.89 here), so best.pt must hold the EMA weights.
# amp=off: the run evaluates in its training precision, and at width 192 amp=auto would train
# (and score) in bf16 on a CPU with AVX512-BF16 or AMX, one image off `vitkit eval`'s fp32.
RUN = ["epochs=2", "ema_decay=0.8", "lr=0.003", "progress=false", "amp=off", "model.act=gelu_tanh",
       "model.width=192", "model.num_heads=3", "model.mlp_dim=384", "model.depth=2",
       "model.patch_size=4"]
TOL = 1e-6


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"


@pytest.fixture(scope="module")
def run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("run")
    run_loop(build_run(load_train_config("digits", [*RUN, f"out_dir={out}"])))
    return out


def _best_row(run: Path) -> dict:
    history = load_state(run / "best.pt")["history"]
    return max(history, key=lambda row: max(row["top1"], row["ema_top1"]))


def _eval(tmp_path: Path, weights: Path | str, *flags: str) -> dict:
    out = tmp_path / "eval"
    assert main(["eval", str(weights), "--out", str(out), *flags]) == 0
    return json.loads((out / "eval.json").read_text())


def _accuracy(forward, images: torch.Tensor, labels: torch.Tensor) -> float:
    """Top-1 of a reference model on uint8 digits scaled to [-1, 1] (the run's mean/std)."""
    with torch.no_grad():
        logits = forward((images.float() / 255 - 0.5) / 0.5)
    return (logits.argmax(1) == labels).double().mean().item()


def _digits_test() -> tuple[torch.Tensor, torch.Tensor]:
    test = open_source("digits")[1]
    return test.images, test.labels


# -- EMA decided once --------------------------------------------------------------------------
def test_best_checkpoint_reproduces_the_score_that_picked_it(run, tmp_path):
    row = _best_row(run)
    assert row["ema_top1"] > row["top1"]  # the setting above makes the EMA win
    assert load_state(run / "best.pt")["weights"] == "ema"
    report = _eval(tmp_path, run / "best.pt")  # data as the run recorded: digits
    assert report["weights"] == "ema" and report["data"] == "digits"
    assert abs(report["top1"] - row["ema_top1"]) <= TOL
    # the library call too, and resume still has the raw weights next to the EMA
    evaluate_checkpoint(run / "best.pt", out=tmp_path / "lib")
    library = json.loads((tmp_path / "lib" / "eval.json").read_text())
    assert abs(library["top1"] - max(row["top1"], row["ema_top1"])) <= TOL
    state = load_state(run / "best.pt")
    record = read_weights(run / "best.pt")
    assert not torch.equal(state["model"]["head.weight"], record.state_dict["head.weight"])
    assert torch.equal(state["ema"]["module.head.weight"], record.state_dict["head.weight"])


# -- every format -----------------------------------------------------------------------------
def test_eval_reads_a_run_folder_and_says_which_file(run, tmp_path, caplog):
    with caplog.at_level(logging.INFO):
        report = _eval(tmp_path, run)
    says(caplog.text, str(run), "run folder", "best.pt")
    assert abs(report["top1"] - max(_best_row(run)["top1"], _best_row(run)["ema_top1"])) <= TOL


def test_eval_needs_data_for_weights_without_a_recipe_and_says_how(run, tmp_path, capsys):
    folder = save_pretrained(load_pretrained(run), tmp_path / "folder")
    assert main(["eval", str(folder), "--out", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    assert "--data digits" in err and "Traceback" not in err
    report = _eval(tmp_path, folder, "--data", "digits")  # as the message says
    assert report["origin"] == "vitkit"
    assert abs(report["top1"] - _best_row(run)["ema_top1"]) <= TOL


def test_eval_of_an_official_npz(run, tmp_path):
    path = save_npz(load_pretrained(run), tmp_path / "digits.npz")
    report = _eval(tmp_path, path, "--data", "digits")
    assert report["origin"] == "npz" and report["origin"] in ORIGINS
    assert abs(report["top1"] - _best_row(run)["ema_top1"]) <= TOL


def test_eval_of_a_timm_file_equals_timm_itself(run, tmp_path):
    reference = timm_vit.VisionTransformer(img_size=8, patch_size=4, in_chans=1, num_classes=10,
                                           embed_dim=192, depth=2, num_heads=3, mlp_ratio=2.0,
                                           act_layer="gelu_tanh").eval()
    reference.load_state_dict(load_pretrained(run).state_dict())
    save_file(reference.state_dict(), tmp_path / "timm.safetensors")
    report = _eval(tmp_path, tmp_path / "timm.safetensors", "--data", "digits")
    assert report["origin"] == "timm"
    assert abs(report["top1"] - _accuracy(reference, *_digits_test())) <= TOL


def _hf_copy(model: torch.nn.Module) -> ViTForImageClassification:
    """A Hugging Face ViT holding `model`'s weights, copied by hand (q, k, v split)."""
    hf = ViTForImageClassification(HFConfig(
        image_size=8, patch_size=4, num_channels=1, hidden_size=192, num_hidden_layers=2,
        num_attention_heads=3, intermediate_size=384, hidden_act="gelu_pytorch_tanh",
        layer_norm_eps=1e-6, num_labels=10, qkv_bias=True)).eval()
    sd = model.state_dict()
    new = {"vit.embeddings.cls_token": sd["cls_token"],
           "vit.embeddings.position_embeddings": sd["pos_embed"],
           "vit.embeddings.patch_embeddings.projection.weight": sd["patch_embed.proj.weight"],
           "vit.embeddings.patch_embeddings.projection.bias": sd["patch_embed.proj.bias"],
           "vit.layernorm.weight": sd["norm.weight"], "vit.layernorm.bias": sd["norm.bias"],
           "classifier.weight": sd["head.weight"], "classifier.bias": sd["head.bias"]}
    for i in range(2):
        ours, theirs = f"blocks.{i}.", f"vit.layers.{i}."
        for kind in ("weight", "bias"):
            for name, part in zip("qkv", sd[f"{ours}attn.qkv.{kind}"].chunk(3), strict=True):
                new[f"{theirs}attention.{name}_proj.{kind}"] = part
            new[f"{theirs}attention.o_proj.{kind}"] = sd[f"{ours}attn.proj.{kind}"]
            new[f"{theirs}layernorm_before.{kind}"] = sd[f"{ours}norm1.{kind}"]
            new[f"{theirs}layernorm_after.{kind}"] = sd[f"{ours}norm2.{kind}"]
            for fc in ("fc1", "fc2"):
                new[f"{theirs}mlp.{fc}.{kind}"] = sd[f"{ours}mlp.{fc}.{kind}"]
    hf.load_state_dict(new)
    return hf


def test_eval_of_a_hugging_face_folder_equals_transformers_itself(run, tmp_path):
    reference = _hf_copy(load_pretrained(run))
    reference.save_pretrained(tmp_path / "hf")
    report = _eval(tmp_path, tmp_path / "hf", "--data", "digits")
    assert report["origin"] == "huggingface"
    expected = _accuracy(lambda x: reference(pixel_values=x).logits, *_digits_test())
    assert abs(report["top1"] - expected) <= TOL


def test_eval_resizes_images_to_the_model_and_says_so(run, tmp_path, caplog):
    big = save_pretrained(load_pretrained(run, img_size=16), tmp_path / "at16")
    with caplog.at_level(logging.INFO):
        report = _eval(tmp_path, big, "--data", "digits")
    says(caplog.text, "8x8", "16x16", "resizing")
    model = load_pretrained(big)
    images, labels = _digits_test()
    expected = _accuracy(lambda x: model(F.interpolate(x, size=(16, 16), mode="bilinear",
                                                       antialias=True)), images, labels)
    assert abs(report["top1"] - expected) <= TOL


# -- the other verbs on a run folder -----------------------------------------------------------
def test_predict_export_and_explain_take_a_run_folder(run, tmp_path, caplog, capsys):
    images, _ = _digits_test()
    files = []
    for i in range(3):
        files.append(tmp_path / f"digit{i}.png")
        Image.fromarray(images[i, 0].numpy(), mode="L").save(files[-1])
    with caplog.at_level(logging.INFO):
        assert main(["predict", str(run), *map(str, files), "--json", "--topk", "1"]) == 0
    assert f"{run} is a run folder: using best.pt" in caplog.text
    predicted = [json.loads(line)["topk"][0]["index"]
                 for line in capsys.readouterr().out.splitlines()]
    model = load_pretrained(run)
    with torch.no_grad():
        expected = model(model.preprocess.normalize(images[:3])).argmax(1).tolist()
    assert predicted == expected
    caplog.clear()
    with caplog.at_level(logging.INFO):
        assert main(["export", str(run), "--out", str(tmp_path / "run.onnx")]) == 0
        assert main(["explain", str(run), "--out", str(tmp_path / "explain"),
                     "--num-images", "2"]) == 0
    assert caplog.text.count("is a run folder: using best.pt") == 2
    assert (tmp_path / "run.onnx").stat().st_size > 0
    assert (tmp_path / "explain" / "explain.json").is_file()


# -- one report per data folder ----------------------------------------------------------------
def _digit_folder(root: Path, images: torch.Tensor, labels: torch.Tensor,
                  names: list[str]) -> Path:
    """An image folder (train/ and val/ of class sub-folders `names`) of the digits given."""
    for split in ("train", "val"):
        for i, (image, label) in enumerate(zip(images, labels, strict=True)):
            folder = root / split / names[int(label)]
            folder.mkdir(parents=True, exist_ok=True)
            Image.fromarray(image[0].numpy(), mode="L").save(folder / f"{i}.png")
    return root


def test_evaluations_on_two_data_folders_keep_a_report_each_naming_the_folder(run, tmp_path):
    images, labels = _digits_test()
    images, labels = images[:40], labels[:40]
    names = [f"d{i}" for i in range(10)]
    right = _digit_folder(tmp_path / "right", images, labels, names)
    shifted = _digit_folder(tmp_path / "shifted", images, (labels + 1) % 10, names)
    model = load_pretrained(run / "best.pt")
    with torch.no_grad():
        predicted = model(model.preprocess.normalize(images)).argmax(1)
    for folder, truth in ((right, labels), (shifted, (labels + 1) % 10)):
        assert main(["eval", str(run), "--data", "folder", "--data-dir", str(folder)]) == 0
        kept = json.loads((run / f"eval-folder-{folder.name}-test.json").read_text())
        assert kept["data_dir"] == str(folder) and kept["images"] == 40
        assert abs(kept["top1"] - (predicted == truth).double().mean().item()) <= TOL
    right_report = json.loads((run / "eval-folder-right-test.json").read_text())
    assert right_report["top1"] != kept["top1"]  # the first folder's report was not overwritten
    assert json.loads((run / "eval.json").read_text()) == kept  # eval.json: the latest


def test_a_folder_of_some_of_the_models_classes_is_scored_by_their_names(run, tmp_path, capsys,
                                                                         caplog):
    """A folder holding classes 3 and 5 only is scored against the model's classes 3 and 5,
    matched by name, not against the model's classes 0 and 1 by position."""
    images, labels = _digits_test()
    chosen = (labels == 3) | (labels == 5)
    images, labels = images[chosen][:30], labels[chosen][:30]
    model = load_pretrained(run / "best.pt")
    with torch.no_grad():
        predicted = model(model.preprocess.normalize(images)).argmax(1)
    expected = (predicted == labels).double().mean().item()
    folder = _digit_folder(tmp_path / "some", images, labels,
                           [str(i) for i in range(10)])  # sub-folders 3/ and 5/ only
    with caplog.at_level(logging.INFO):
        report = _eval(tmp_path, run, "--data", "folder", "--data-dir", str(folder))
    says(caplog.text, "matched", "by name", "2 of its 10")
    assert abs(report["top1"] - expected) <= TOL and expected > 0.5
    assert set(report["per_class_accuracy"]) == {"3", "5"}  # the data's classes, not all ten
    names = [f"d{i}" if i == 5 else str(i) for i in range(10)]  # 5/ renamed d5/
    other = _digit_folder(tmp_path / "other", images, labels, names)
    assert main(["eval", str(run), "--data", "folder", "--data-dir", str(other)]) == 2
    says(capsys.readouterr().err, "classes the model does not", "d5", "0, 1, 2, 3, 4")


def test_a_class_name_the_model_gives_twice_is_scored_by_position_with_a_warning(caplog):
    """A class name the model gives twice (ImageNet's "crane", "maillot") has no one output
    to match: the folder is scored by position, with a warning naming the class."""
    from vitkit.tasks import match_classes

    with caplog.at_level(logging.WARNING):
        assert match_classes(["crane", "tench"], ["tench", "crane", "goldfish", "crane"],
                             "folder") is None
    says(caplog.text, "crane", "more than once", "by position")
    assert match_classes(["goldfish", "tench"], ["tench", "crane", "goldfish", "crane"],
                         "folder").tolist() == [2, 0]


# -- a folder of test images only --------------------------------------------------------------
def test_a_folder_of_test_images_only_is_evaluated_following_the_advice(run, tmp_path, capsys):
    """A labelled folder without train/ (class sub-folders, val/ alone, or test/ with a
    targets table) evaluates as the held-out split with --data folder, as the refusal of
    `--data-dir` alone advises; asking for its train split names the missing folder."""
    images, labels = _digits_test()
    images, labels = images[:40], labels[:40]
    model = load_pretrained(run / "best.pt")
    with torch.no_grad():
        expected = (model(model.preprocess.normalize(images)).argmax(1) == labels
                    ).double().mean().item()
    whole = _digit_folder(tmp_path / "whole", images, labels, [str(i) for i in range(10)])
    only_val = tmp_path / "only_val"
    only_val.mkdir()
    (whole / "val").rename(only_val / "val")
    classes_only = tmp_path / "classes_only"
    (whole / "train").rename(classes_only)
    table_only = tmp_path / "table_only"  # test/ with targets.csv of class indices
    (table_only / "test").mkdir(parents=True)
    rows = ["file,digit"]
    for i, (image, label) in enumerate(zip(images, labels, strict=True)):
        Image.fromarray(image[0].numpy(), mode="L").save(table_only / "test" / f"{i}.png")
        rows.append(f"{i}.png,{int(label)}")
    (table_only / "test" / "targets.csv").write_text("\n".join(rows) + "\n")
    assert main(["eval", str(run), "--data-dir", str(classes_only)]) == 2
    says(capsys.readouterr().err, "name the data", "data=folder")
    for folder, flags in ((classes_only, []), (only_val, []), (only_val, ["--split", "val"]),
                          (table_only, [])):
        report = _eval(tmp_path, run, "--data", "folder", "--data-dir", str(folder), *flags)
        assert report["split"] == "test" and report["images"] == 40
        assert abs(report["top1"] - expected) <= TOL
    assert main(["eval", str(run), "--data", "folder", "--data-dir", str(classes_only),
                 "--split", "train"]) == 2
    says(capsys.readouterr().err, "classes_only", "not train/ and val/", "move the class folders")

    assert main(["explain", str(run), "--data", "folder", "--data-dir", str(classes_only),
                 "--num-images", "2", "--out", str(tmp_path / "explained")]) == 0
