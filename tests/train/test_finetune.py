"""`vitkit finetune`: the paper's fine-tuning recipe from pretrained weights (a vitkit folder or
an official-layout .npz), at a higher resolution than the weights were trained at: on the data
a run recorded, with a head sized to the data's classes, never into a saved model's folder, and
with the new data's preprocessing (pictures after arrays)."""

import json
import logging
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import scipy.ndimage
import torch
from PIL import Image

import vitkit
from vitkit.catalog import load_pretrained, read_weights
from vitkit.cli import main
from vitkit.config import ViTConfig
from vitkit.errors import CheckpointError, ConfigError
from vitkit.model.posembed import resample_grid_embed
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess
from vitkit.train.checkpoint import load_state
from vitkit.train.checkpoint import load_state as load_checkpoint
from vitkit.train.config import load_train_config
from vitkit.train.finetune import default_img_size, resize_random_crop, target_config
from vitkit.train.loop import run_loop
from vitkit.train.setup import build_run
from vitkit.weights import save_npz, save_pretrained
from vitkit.weights.record import check_tensors


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


# Fine-tuning at 16 px what was pretrained at 8 px: the 4x4 position grid becomes 8x8.
SMALL = ["data=digits", "model.img_size=16", "batch_size=64", "accum_steps=2",
         "total_steps=40", "warmup_steps=5", "lr=0.05", "resize_crop=1", "progress=false"]


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory) -> dict[str, Path]:
    """A small ViT pretrained on the 8x8 digits (~60% held out) with a 12-way head and a
    pre-logits layer, saved as a vitkit folder, as an official-layout .npz, and as a folder
    that declares another normalisation (mean 0.3, std 0.2)."""
    root = tmp_path_factory.mktemp("pretrained")
    cfg = load_train_config("digits", ["epochs=12", "warmup_epochs=1", "progress=false",
                                       "model.depth=2", "model.num_classes=12",
                                       "model.pre_logits_dim=32", f"out_dir={root / 'run'}"])
    run_loop(build_run(cfg))
    model = load_pretrained(root / "run" / "last.pt")
    custom = save_pretrained(model, root / "custom",
                             preprocess=Preprocess(img_size=8, mean=(0.3,), std=(0.2,)))
    return {"folder": save_pretrained(model, root / "folder"), "custom": custom,
            "npz": save_npz(model, root / "tiny.npz"), "model": model}


def _history(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_recipe_holds_the_official_numbers():
    cfg = load_train_config("finetune")
    assert (cfg.optimizer, cfg.momentum, cfg.weight_decay, cfg.clip_grad) == ("sgd", 0.9, 0, 1)
    assert (cfg.lr, cfg.schedule, cfg.warmup_steps, cfg.total_steps) == (0.03, "cosine", 500,
                                                                         10_000)
    assert (cfg.batch_size, cfg.accum_steps) == (512, 8)
    # 384 px for weights pretrained at 224 px (the paper's); model.img_size is left unset
    assert cfg.finetune_overrides() == {} and default_img_size(
        ViTConfig(img_size=224, patch_size=16)) == (384, 384)
    # positions resampled as the weights' own code does: vit_jax's corner-aligned bilinear
    # for official .npz files (weights/test_pretrained.py checks it against scipy.ndimage.zoom)
    assert cfg.new_head and cfg.pos_interpolation == "auto" and cfg.mean is None
    assert cfg.augment == {"crop_padding": 0, "flip": True}
    assert cfg.resize_crop == pytest.approx(512 / 384)
    assert cfg.ema_decay == 0 and cfg.init_from is None


def test_training_from_scratch_keeps_adamw_and_takes_warmup_in_steps():
    trainer = build_run(load_train_config("digits", ["progress=false"]))
    assert isinstance(trainer.optimizer, torch.optim.AdamW)
    assert trainer.warmup_steps == 2 * trainer.data.order.batches_per_epoch()
    assert trainer.preprocess.mean == (0.5,)
    sgd = build_run(load_train_config("digits", ["optimizer=sgd", "momentum=0.8",
                                               "warmup_steps=7", "progress=false"]))
    assert isinstance(sgd.optimizer, torch.optim.SGD) and sgd.warmup_steps == 7
    assert [g["momentum"] for g in sgd.optimizer.param_groups] == [0.8, 0.8]
    with pytest.raises(ConfigError, match="Did you mean 'sgd'"):
        load_train_config("digits", ["optimizer=sgdd"])


def test_finetune_from_a_vitkit_folder(tmp_path, pretrained):
    cfg = load_train_config("finetune", [f"init_from={pretrained['folder']}", *SMALL,
                                         f"out_dir={tmp_path}"])
    trainer = build_run(cfg)
    model = trainer.model
    # new zero head sized by the data, pre-logits dropped, positions resampled to 8x8
    assert model.config.num_classes == 10 and model.config.img_size == (16, 16)
    assert not model.head.weight.any() and not model.head.bias.any()
    assert isinstance(model.pre_logits, torch.nn.Identity) and model.config.pre_logits_dim == 0
    source = pretrained["model"].pos_embed.detach()
    assert source.shape[1] == 1 + 4 * 4 and model.pos_embed.shape[1] == 1 + 8 * 8
    expected = resample_grid_embed(source, (4, 4), (8, 8), 1, "bilinear")
    assert torch.allclose(model.pos_embed.detach(), expected)
    assert model.training  # build_model returns eval mode: dropout must come back on
    # SGD, momentum 0.9, no weight decay in either group
    assert isinstance(trainer.optimizer, torch.optim.SGD)
    assert {(g["momentum"], g["weight_decay"]) for g in trainer.optimizer.param_groups} == \
        {(0.9, 0.0)}

    run_loop(trainer)
    history = _history(tmp_path)
    assert history[-1]["train_loss"] < history[0]["train_loss"] - 0.2, history
    assert history[-1]["top1"] > 0.25, history  # chance is 0.1; 40 steps from a new head
    state = load_checkpoint(tmp_path / "last.pt")
    assert state["model"]["head.weight"].shape == (10, 64)
    assert not any(key.startswith("pre_logits") for key in state["model"])
    saved = Preprocess.from_dict(state["preprocess"])
    assert (saved.img_size, saved.mean, saved.std) == ((16, 16), (0.5,), (0.5,))
    assert (tmp_path / "best.pt").stat().st_size > 0


def test_finetune_from_an_npz_resamples_positions_as_vit_jax(pretrained):
    """The recipe's pos_interpolation "auto" follows the official code for official files:
    vit_jax's scipy.ndimage.zoom(order=1) on the grid, the class token's row kept."""
    cfg = load_train_config("finetune", [f"init_from={pretrained['npz']}", *SMALL])
    tuned = build_run(cfg).model.pos_embed.detach()[0]
    source = pretrained["model"].pos_embed.detach()[0]
    zoomed = scipy.ndimage.zoom(source[1:].numpy().reshape(4, 4, -1), (2, 2, 1), order=1)
    assert torch.equal(tuned[0], source[0])
    assert np.abs(tuned[1:].numpy() - zoomed.reshape(64, -1)).max() <= 1e-5


def test_normalisation_comes_from_the_checkpoint_unless_set(tmp_path, pretrained):
    base = [f"init_from={pretrained['custom']}", *SMALL, f"out_dir={tmp_path}"]
    trainer = build_run(load_train_config("finetune", base))
    assert (trainer.preprocess.mean, trainer.preprocess.std) == ((0.3,), (0.2,))
    trainer = build_run(load_train_config("finetune", [*base, "mean=[0.4]", "std=[0.25]"]))
    assert (trainer.preprocess.mean, trainer.preprocess.std) == ((0.4,), (0.25,))


def test_finetune_cli_from_an_official_npz(tmp_path, pretrained, capsys):
    overrides = [o for o in SMALL if not o.startswith(("data=", "model.img_size="))]
    code = main(["finetune", str(pretrained["npz"]), *overrides, "--data", "digits",
                 "--img-size", "16", "--out", str(tmp_path)])
    assert code == 0, capsys.readouterr().err
    assert "test top-1" in capsys.readouterr().out
    state = load_checkpoint(tmp_path / "last.pt")
    assert state["model_config"]["img_size"] == [16, 16]
    assert state["model_config"]["pre_logits_dim"] == 0
    assert state["model"]["head.weight"].shape == (10, 64)
    assert state["model"]["pos_embed"].shape == (1, 1 + 8 * 8, 64)
    assert state["train_config"]["optimizer"] == "sgd"
    assert _history(tmp_path)[-1]["top1"] > 0.25
    assert main(["eval", str(tmp_path / "best.pt"), "--limit", "100"]) == 0


def test_finetune_resumes_exactly_without_reading_init_from_again(tmp_path, pretrained):
    weights = tmp_path / "weights"
    shutil.copytree(pretrained["custom"], weights)
    overrides = [f"init_from={weights}", *SMALL, "total_steps=30", "model.dropout=0.1",
                 "resize_crop=1.3333"]  # the recipe's random crop draws from the saved RNG
    run_loop(build_run(load_train_config("finetune", [*overrides, f"out_dir={tmp_path / 'a'}"])))

    split = load_train_config("finetune", [*overrides, f"out_dir={tmp_path / 'b'}"])
    first = build_run(split)
    step = first.step

    def stop_halfway(images, labels, lr, position):
        if first.position.step == 14:  # mid-epoch (22 batches an epoch), mid-cosine
            first.stop.reason = "SIGTERM"
        return step(images, labels, lr, position)

    first.step = stop_halfway
    run_loop(first)
    assert load_checkpoint(tmp_path / "b" / "last.pt")["position"]["step"] == 15
    shutil.rmtree(weights)  # resuming reads the run's checkpoint, not init_from
    resumed = build_run(split, resume=tmp_path / "b" / "last.pt")
    assert resumed.preprocess.mean == (0.3,)
    run_loop(resumed)
    a, b = load_checkpoint(tmp_path / "a" / "last.pt"), load_checkpoint(tmp_path / "b" / "last.pt")
    assert a["position"]["step"] == b["position"]["step"] == 30
    for name in a["model"]:
        assert torch.equal(a["model"][name], b["model"][name]), f"{name} differs after resume"
    for key, value in a["optimizer"]["state"].items():
        other = b["optimizer"]["state"][key]["momentum_buffer"]
        assert torch.equal(value["momentum_buffer"], other)


def test_resume_with_another_optimizer_is_refused(tmp_path):
    main(["train", "digits", "total_steps=2", "progress=false", "--out", str(tmp_path)])
    cfg = load_train_config("digits", ["optimizer=sgd", "progress=false"])
    with pytest.raises(CheckpointError, match="optimizer=adamw"):
        build_run(cfg, resume=tmp_path / "last.pt")


def test_init_from_takes_overrides_not_a_variant(tmp_path, pretrained):
    cfg = load_train_config("digits", [f"init_from={pretrained['folder']}", "progress=false"])
    with pytest.raises(ConfigError, match=r"remove model\.variant"):
        build_run(cfg)
    cfg = load_train_config("finetune", [f"init_from={pretrained['folder']}", "model=B/16"])
    with pytest.raises(ConfigError, match=r"model\.img_size=384"):
        build_run(cfg)


def test_resize_random_crop_takes_a_window_of_the_resized_batch():
    images = torch.randn(6, 3, 8, 8)
    out = resize_random_crop(images, (12, 12), 1.5, torch.Generator().manual_seed(0))
    again = resize_random_crop(images, (12, 12), 1.5, torch.Generator().manual_seed(0))
    assert out.shape == (6, 3, 12, 12) and torch.equal(out, again)
    big = torch.nn.functional.interpolate(images, size=(18, 18), mode="bilinear",
                                          align_corners=False, antialias=True)
    for i in range(6):
        windows = big[i].unfold(1, 12, 1).unfold(2, 12, 1)  # (C, 7, 7, 12, 12)
        assert any(torch.equal(windows[:, y, x], out[i]) for y in range(7) for x in range(7))


@pytest.mark.slow
def test_finetune_under_torchrun_equals_one_process(tmp_path, pretrained):
    # 12 steps: enough to show the sharding, accumulation and gradient average are right (any
    # of them wrong moves weights by ~1e-2 from the first step), short of where lr 0.05 has
    # amplified summation-order rounding past the tolerance (2e-6 at 12 steps, 2.4e-4 at 20 on
    # a Zen 4 EPYC)
    overrides = [*SMALL, "total_steps=12", "threads=1"]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node", "2", "-m", "vitkit.cli", "finetune", str(pretrained["npz"]),
                    *overrides, "--out", str(tmp_path / "ddp")], check=True, env=env,
                   capture_output=True)
    assert main(["finetune", str(pretrained["npz"]), *overrides,
                 "--out", str(tmp_path / "single")]) == 0
    ddp = load_checkpoint(tmp_path / "ddp" / "last.pt")
    single = load_checkpoint(tmp_path / "single" / "last.pt")
    assert ddp["position"]["step"] == single["position"]["step"] == 12
    worst = max((ddp["model"][k] - single["model"][k]).abs().max().item() for k in single["model"])
    assert worst <= 1e-4  # same global batches; only the all-reduce summation order differs


def test_the_default_resolution_is_384_only_for_weights_pretrained_at_224(tmp_path, pretrained):
    at_224 = VisionTransformer(ViTConfig(img_size=224, patch_size=32, width=32, depth=1,
                                         num_heads=2, mlp_dim=64, num_classes=5))
    record = read_weights(save_pretrained(at_224, tmp_path / "224"))
    recipe = load_train_config("finetune", [f"init_from={tmp_path / '224'}"])
    assert target_config(record, recipe.finetune_overrides()).img_size == (384, 384)
    assert target_config(record, {"img_size": 256}).img_size == (256, 256)  # set: kept

    # weights pretrained at 8 px (not 224) keep their own size: 16 tokens, not 36,864
    small = [o for o in SMALL if not o.startswith("model.img_size=")]
    trainer = build_run(load_train_config("finetune", [f"init_from={pretrained['folder']}",
                                                     *small, f"out_dir={tmp_path / 'ft'}"]))
    assert trainer.model.config.img_size == (8, 8) == trainer.preprocess.img_size


def test_a_run_that_cannot_fit_in_memory_is_refused_before_allocating(tmp_path, pretrained,
                                                                      capsys):
    args = ["finetune", str(pretrained["folder"]), "--data", "digits", "total_steps=2",
            "warmup_steps=1", "batch_size=64", "accum_steps=1", "progress=false",
            "--out", str(tmp_path)]
    # 4096 px in 2-px patches = 4,194,305 tokens an image: loading digits at that size alone
    # would need 1797 x 16 MiB = 28 GiB, so getting to the message proves nothing was allocated
    assert main([*args, "--img-size", "4096"]) == 2
    err = capsys.readouterr().err
    assert "needs about" in err and "GiB available" in err and "4,194,305 tokens" in err
    assert "lower batch_size" in err and "model.img_size" in err
    assert not (tmp_path / "last.pt").exists()
    assert main([*args, "--img-size", "16"]) == 0  # following the advice: a lower img_size


def test_a_hybrid_checkpoint_with_batchnorm_step_counters_is_a_valid_init(tmp_path):
    """The conv stem's BatchNorm keeps an int64 `num_batches_tracked` buffer: fine-tuning from
    such a run (the cifar10 recipe's model) reads it, and the stem's running statistics come
    along; an integer tensor that is not such a counter is still refused."""
    stem = ["model.stem=conv", "model.stem_channels=[8,16]", "model.depth=1"]
    cfg = load_train_config("digits", [*stem, "total_steps=3", "warmup_steps=1", "batch_size=32",
                                       "progress=false", f"out_dir={tmp_path / 'hybrid'}"])
    run_loop(build_run(cfg))
    saved = load_checkpoint(tmp_path / "hybrid" / "last.pt")["model"]
    counters = [name for name in saved if name.endswith("num_batches_tracked")]
    assert counters and all(saved[name].dtype == torch.int64 for name in counters)

    cfg = load_train_config("finetune", [f"init_from={tmp_path / 'hybrid' / 'last.pt'}", *SMALL,
                                         f"out_dir={tmp_path / 'tuned'}"])
    state = build_run(cfg).model.state_dict()
    for name in counters:
        running_mean = name.replace("num_batches_tracked", "running_mean")
        assert torch.equal(state[running_mean], saved[running_mean])
        assert int(state[name]) == int(saved[name]) == 3

    bad = dict(saved, **{"head.weight": saved["head.weight"].long()})
    with pytest.raises(CheckpointError) as caught:
        check_tensors(bad, "ints.pt")
    says(str(caught.value), "1 entry", "head.weight", "torch.int64")


# -- resuming a fine-tune from the command line ----------------------------------------------

def test_a_resumed_finetune_keeps_its_own_settings_and_refuses_other_weights_or_model(
        tmp_path, pretrained, capsys):
    """`vitkit finetune W --resume RUN` continues with the checkpoint's settings (its batch,
    data and length), not the finetune recipe's defaults (batch 512, CIFAR-10, 10,000 steps);
    model overrides (which the checkpoint's model would silently ignore) and other weights are
    refused, and the advice (`vitkit train --resume RUN`) works."""
    overrides = [o for o in SMALL if not o.startswith(("data=", "model.img_size=",
                                                       "total_steps="))]
    run = tmp_path / "run"
    assert main(["finetune", str(pretrained["folder"]), *overrides, "total_steps=6",
                 "--data", "digits", "--img-size", "16", "--out", str(run)]) == 0
    capsys.readouterr()
    last = run / "last.pt"

    assert main(["finetune", str(pretrained["folder"]), "--resume", str(last),
                 "model.dropout=0.1"]) == 2
    err = capsys.readouterr().err
    says(err, "other model settings", "dropout", "checkpoint unset", "0.1")
    assert main(["finetune", str(pretrained["npz"]), "--resume", str(last)]) == 2
    says(capsys.readouterr().err, f"fine-tunes {pretrained['folder']}", str(pretrained["npz"]))
    assert load_checkpoint(last)["position"]["step"] == 6  # nothing ran

    assert main(["finetune", str(pretrained["folder"]), "--resume", str(last),
                 "total_steps=8"]) == 0
    state = load_checkpoint(last)
    recipe = state["train_config"]
    assert state["position"]["step"] == 8
    assert (recipe["batch_size"], recipe["data"], recipe["model"]) == (
        64, "digits", {"img_size": (16, 16)})
    assert state["model_config"]["dropout"] == 0.0
    assert main(["train", "--resume", str(last), "total_steps=9"]) == 0  # the advice
    assert load_checkpoint(last)["position"]["step"] == 9


def test_finetune_on_an_image_folder_given_only_by_data_dir(tmp_path, pretrained, capsys):
    """`vitkit finetune W --data-dir FOLDER` without `--data folder` reads an image folder
    there as data=folder (not the recipe's default CIFAR-10), as `vitkit train` does."""
    from PIL import Image

    rng = np.random.default_rng(0)
    for split, count in (("train", 6), ("val", 2)):
        for label in ("a", "b"):
            (tmp_path / "data" / split / label).mkdir(parents=True)
            for i in range(count):
                pixels = rng.integers(0, 256, (8, 8), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / "data" / split / label / f"{i}.png")
    code = main(["finetune", str(pretrained["folder"]), "--data-dir", str(tmp_path / "data"),
                 "total_steps=2", "warmup_steps=1", "batch_size=4", "accum_steps=1",
                 "progress=false",
                 "--out", str(tmp_path / "run")])
    assert code == 0, capsys.readouterr().err
    recipe = load_checkpoint(tmp_path / "run" / "last.pt")["train_config"]
    assert recipe["data"] == "folder"


def test_a_finetune_that_set_no_model_key_resumes_both_ways(tmp_path, pretrained, capsys):
    """A fine-tune with no --img-size or model.X records TrainConfig's default model name;
    the resume check reads it as that model, not as overrides."""
    overrides = [o for o in SMALL if not o.startswith(("data=", "model.img_size=",
                                                       "total_steps="))]
    run = tmp_path / "run"
    assert main(["finetune", str(pretrained["folder"]), *overrides, "total_steps=6",
                 "--data", "digits", "--out", str(run)]) == 0
    last = run / "last.pt"
    assert main(["finetune", str(pretrained["folder"]), "--resume", str(last),
                 "total_steps=7"]) == 0, capsys.readouterr().err
    assert main(["train", "--resume", str(last), "total_steps=8"]) == 0
    assert load_checkpoint(last)["position"]["step"] == 8


def test_finetune_resume_of_a_run_from_scratch_is_refused_naming_both_ways_on(
        tmp_path, pretrained, capsys):
    run = tmp_path / "scratch"
    assert main(["train", "digits", "total_steps=2", "progress=false", "--out", str(run)]) == 0
    capsys.readouterr()
    last = run / "last.pt"
    assert main(["finetune", str(pretrained["folder"]), "--resume", str(last)]) == 2
    says(capsys.readouterr().err, "trained from scratch", str(pretrained["folder"]),
         f"vitkit train --resume {last}")
    assert "init_from" not in load_checkpoint(last)["train_config"] or \
        not load_checkpoint(last)["train_config"]["init_from"]
    assert main(["train", "--resume", str(last), "total_steps=3"]) == 0  # the advice


def test_a_finetune_from_a_relative_path_resumes_from_another_folder(tmp_path, pretrained,
                                                                   monkeypatch):
    weights = tmp_path / "work" / "weights"
    shutil.copytree(pretrained["folder"], weights)
    overrides = [o for o in SMALL if not o.startswith(("data=", "model.img_size=",
                                                       "total_steps="))]
    monkeypatch.chdir(tmp_path / "work")
    assert main(["finetune", "weights", *overrides, "total_steps=6", "--data", "digits",
                 "--out", str(tmp_path / "run")]) == 0
    monkeypatch.chdir(tmp_path)  # elsewhere: the recorded relative path is the run's folder's
    assert main(["finetune", str(weights), "--resume", str(tmp_path / "run" / "last.pt"),
                 "total_steps=7"]) == 0


def test_a_cifar_recipe_keeps_cifar_in_a_data_dir_that_also_holds_pictures(tmp_path):
    """Only a fine-tune whose default is CIFAR reads an image folder given by --data-dir
    alone as data=folder; `vitkit train cifar10 --data-dir DIR` with DIR holding the CIFAR
    folder and a folder of pictures stays on CIFAR."""
    from PIL import Image

    from vitkit.train.recipe import run_config

    cifar = tmp_path / "data" / "cifar-10-batches-bin"
    cifar.mkdir(parents=True)
    for name in ("batches.meta.txt", *(f"data_batch_{i}.bin" for i in range(1, 6)),
                 "test_batch.bin"):
        (cifar / name).write_bytes(b"")
    (tmp_path / "data" / "photos").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "data" / "photos" / "a.png")
    for recipe in ("cifar10", "cifar10-tutorial"):
        assert run_config(recipe, [], data_dir=str(tmp_path / "data")).data == "cifar10"


def test_a_kept_head_whose_outputs_are_named_otherwise_is_warned_of(tmp_path, caplog):
    """new_head=false keeps the weights' classifier, output i for the data's class i: where the
    weights name their outputs otherwise than the data's classes, a warning names each pair;
    with the classes in the weights' order it stays quiet."""
    from PIL import Image

    from vitkit import create_model

    model = create_model("Ti/4", img_size=8, in_chans=1, width=32, depth=1, num_heads=2,
                         mlp_dim=64, num_classes=2)
    model.class_names = ["b", "a"]
    weights = save_pretrained(model, tmp_path / "weights")
    rng = np.random.default_rng(0)
    for split in ("train", "val"):
        for label in ("a", "b"):
            (tmp_path / "data" / split / label).mkdir(parents=True)
            for i in range(4):
                pixels = rng.integers(0, 256, (8, 8), dtype=np.uint8)
                Image.fromarray(pixels).save(tmp_path / "data" / split / label / f"{i}.png")
    common = ["--data", "folder", "--data-dir", str(tmp_path / "data"), "total_steps=1",
              "warmup_steps=0", "batch_size=4", "accum_steps=1", "progress=false",
              "model.img_size=8"]
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main(["finetune", str(weights), *common, "new_head=false",
                     "--out", str(tmp_path / "kept")]) == 0
    said = [r.getMessage() for r in caplog.records if "new_head=false keeps" in r.getMessage()]
    assert len(said) == 1
    says(said[0], "2 of its 2 outputs", "output 0", "'b' in the weights", "'a' in the data")
    caplog.clear()
    model.class_names = ["a", "b"]
    weights = save_pretrained(model, tmp_path / "ordered")
    with caplog.at_level(logging.WARNING, logger="vitkit"):
        assert main(["finetune", str(weights), *common, "new_head=false",
                     "--out", str(tmp_path / "ordered_run")]) == 0
    assert not [r for r in caplog.records if "new_head=false keeps" in r.getMessage()]


TINY = {"img_size": 16, "patch_size": 8, "width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32}


QUICK = ["total_steps=2", "warmup_steps=0", "batch_size=4", "accum_steps=1", "progress=false"]


def _folder(root: Path, classes: list[str], splits: tuple[str, ...] = ("train", "val")) -> Path:
    for split in splits:
        for k, name in enumerate(classes):
            (root / split / name).mkdir(parents=True, exist_ok=True)
            for i in range(3):
                Image.new("RGB", (16, 16), (70 * k + 5 * i, 30, 200 - 60 * k)).save(
                    root / split / name / f"{i}.png")
    return root


@pytest.fixture()
def weights(tmp_path) -> Path:
    return vitkit.save_pretrained(vitkit.create_model({**TINY, "num_classes": 5}),
                                  tmp_path / "weights")


def test_finetune_refuses_a_head_size_other_than_the_datas(tmp_path, weights, capsys):
    """A head of another size than the data's classes would train outputs no image has."""
    data = _folder(tmp_path / "colours", ["red", "green", "blue"])
    out = tmp_path / "tuned"
    argv = ["finetune", str(weights), "--data", "folder", "--data-dir", str(data), *QUICK,
            "--out", str(out)]
    assert main([*argv, "model.num_classes=10"]) == 2
    says(capsys.readouterr().err, "model.num_classes=10", str(data), "3 outputs",
         "leave model.num_classes out")
    assert main(argv) == 0  # the advice: leave model.num_classes out
    assert vitkit.load_pretrained(out).config.num_classes == 3


def test_finetune_refuses_to_write_its_run_into_a_saved_model_folder(tmp_path, weights,
                                                                     capsys):
    """A run is not written into a saved model's folder (its config.json would keep the folder
    reading as the old model): the refusal names the folder's files, another --out trains, and
    a run folder holding a saved copy of its weights resumes."""
    data = _folder(tmp_path / "colours", ["red", "green", "blue"])
    argv = ["finetune", str(weights), "--data", "folder", "--data-dir", str(data), *QUICK]
    assert main([*argv, "--out", str(weights)]) == 2
    says(capsys.readouterr().err, str(weights), "saved weights", "model.safetensors",
         "config.json", "another --out")
    assert not (weights / "last.pt").exists()
    assert main([*argv, "--out", str(tmp_path / "elsewhere")]) == 0  # another --out folder
    assert vitkit.load_pretrained(tmp_path / "elsewhere").config.num_classes == 3
    run = tmp_path / "elsewhere"  # a run folder holding a saved copy of its weights resumes
    vitkit.save_pretrained(vitkit.load_pretrained(run / "best.pt"), run)
    assert main(["train", "total_steps=3", "--resume", str(run / "last.pt")]) == 0


SMALL_ARRAYS = ["data=arrays", "model.depth=1", "model.width=16", "model.num_heads=2",
                "model.mlp_dim=32", "model.patch_size=4", "model.img_size=8", "epochs=1",
                "batch_size=16", "warmup_epochs=0", "progress=false"]


def _arrays(root: Path, train_targets: np.ndarray, test_targets: np.ndarray | None = None,
            **extra) -> Path:
    root.mkdir(parents=True)
    rng = np.random.default_rng(0)
    test_targets = train_targets if test_targets is None else test_targets
    for split, targets in (("train", train_targets), ("test", test_targets)):
        images = rng.random((len(targets), 8, 8), dtype=np.float32)
        np.savez(root / f"{split}.npz", images=images, targets=targets,
                 **(extra if split == "train" else {}))
    return root


def _pictures(root: Path, seed: int) -> None:
    """An image folder of 8x8 gray PNGs: train/ and val/, classes a and b, 4 images each."""
    from PIL import Image

    rng = np.random.default_rng(seed)
    for split in ("train", "val"):
        for name in ("a", "b"):
            folder = root / split / name
            folder.mkdir(parents=True)
            for index in range(4):
                Image.fromarray(rng.integers(0, 255, (8, 8), dtype=np.uint8)).save(
                    folder / f"{index}.png")


def test_fine_tuning_weights_of_arrays_on_pictures_reads_them_as_pictures(tmp_path: Path,
                                                                          capsys) -> None:
    """The pictures' preprocessing (scale 255) replaces the arrays' (scale 1), so the run
    trains on [0, 1] values and its weights take the pictures they were tuned on."""
    floats = _arrays(tmp_path / "floats", np.arange(32) % 2)
    assert main(["train", *SMALL_ARRAYS, f"data_dir={floats}", "--out", str(tmp_path / "f")]) == 0
    _pictures(tmp_path / "pics", seed=3)
    assert main(["finetune", str(tmp_path / "f"), "--data", "folder", "--data-dir",
                 str(tmp_path / "pics"), "total_steps=2", "warmup_steps=0", "batch_size=8",
                 "accum_steps=1", "progress=false", "--out", str(tmp_path / "tuned")]) == 0
    saved = torch.load(tmp_path / "tuned" / "last.pt", weights_only=True)["preprocess"]
    assert saved["scale"] == 255 and saved["mean"] == [0.5]
    capsys.readouterr()
    assert main(["predict", str(tmp_path / "tuned"),
                 str(tmp_path / "pics" / "val" / "a" / "0.png")]) == 0


def _recipe(path: Path) -> dict:
    return load_state(path)["train_config"]


def test_finetune_of_a_run_uses_the_data_it_recorded(tmp_path, caplog, capsys):
    pretrained = tmp_path / "pre"
    assert main(["train", "digits", "total_steps=2", "warmup_steps=1", "model.depth=1",
                 "progress=false", "--out", str(pretrained)]) == 0
    with caplog.at_level(logging.INFO, logger="vitkit.train"):
        assert main(["finetune", str(pretrained), "total_steps=2", "warmup_steps=1",
                     "batch_size=16", "accum_steps=1", "progress=false",
                     "--out", str(tmp_path / "ft")]) == 0
    assert "fine-tuning on data=digits" in caplog.text
    assert _recipe(tmp_path / "ft" / "last.pt")["data"] == "digits"
    with pytest.raises(SystemExit):
        main(["finetune", "--help"])
    assert "hf:NAME_OR_PATH" in capsys.readouterr().out
