"""Training configs are checked where they enter (recipe, overrides, Python): each bad
setting gets one message naming it, and the fix the message suggests works."""


import pytest
import torch

from vitkit import ConfigError
from vitkit.cli import main
from vitkit.train.config import TrainConfig, load_train_config
from vitkit.train.setup import build_run

# (bad overrides of the digits recipe, what the message says, overrides that follow its advice)
CHECKS = [
    (["epochs=-1"], r"epochs=-1 must be > 0", ["epochs=0.5", "warmup_epochs=0.1"]),
    (["epochs=0"], r"epochs=0 must be > 0.*total_steps=N", ["epochs=1", "total_steps=5"]),
    (["total_steps=-5"], r"total_steps=-5 must be >= 0", ["total_steps=0"]),
    (["batch_size=0"], r"batch_size=0 must be >= 1.*batch_size=64", ["batch_size=64"]),
    (["batch_size=-8"], r"batch_size=-8 must be >= 1", ["batch_size=64"]),
    (["lr=-0.001"], r"lr=-0.001 must be >= 0, e.g. lr=0.001", ["lr=0.001"]),
    (["weight_decay=-0.1"], r"weight_decay=-0.1 must be >= 0", ["weight_decay=0.05"]),
    (["total_steps=10", "warmup_steps=20"], r"warmup_steps=20 is longer than the run "
     r"\(total_steps=10\).*lower warmup_steps", ["warmup_steps=1"]),
    (["epochs=1"], r"warmup_epochs=2 is longer than the run \(epochs=1\).*"
     r"warmup_epochs=0.1", ["warmup_epochs=0.1"]),
    (["warmup_epochs=-1"], r"warmup_epochs=-1 must be >= 0", ["warmup_epochs=0"]),
    (["warmup_steps=-1"], r"warmup_steps=-1 must be >= 0", ["warmup_steps=null"]),
    (["accum_steps=3"], r"batch_size 64 is not divisible by accum_steps 3.*\[1, 2, 4, 8",
     ["accum_steps=4"]),
    (["accum_steps=0"], r"accum_steps=0 must be >= 1", ["accum_steps=1"]),
    (["ema_decay=1"], r"ema_decay=1 must be in \[0, 1\)", ["ema_decay=0.9999"]),
    (["ema_decay=-0.5"], r"ema_decay=-0.5 must be in \[0, 1\).*0 or null = no", ["ema_decay=0"]),
    (["time_budget=-1"], r"time_budget=-1 must be >= 0 seconds", ["time_budget=0"]),
    (["model.img_size=1"], r"image size 1x1 is smaller than the patch size 2.*at least 2x2",
     ["model.img_size=2"]),
    (["model.img_size=0"], r"image size 0x0 is smaller than the patch size 2",
     ["model.img_size=8"]),
    (["eval_every=0"], r"eval_every=0 must be >= 1", ["eval_every=1"]),
    (["eval_batch_size=0"], r"eval_batch_size=0 must be >= 1", ["eval_batch_size=500"]),
    (["tta=mirror"], r"tta='mirror' is not one of none, flip", ["tta=flip"]),
    (["threads=0"], r"threads=0 must be >= 1 \(or null", ["threads=null"]),
    (["train_limit=0"], r"train_limit=0 must be >= 1 images \(or null", ["train_limit=null"]),
    (["min_lr_ratio=2"], r"min_lr_ratio=2 must be in \[0, 1\]", ["min_lr_ratio=0.1"]),
    (["clip_grad=-1"], r"clip_grad=-1 must be >= 0", ["clip_grad=0"]),
    (["betas=[0.9,1.5]"], r"betas=\[0.9, 1.5\] must both be in \[0, 1\)", ["betas=[0.9,0.999]"]),
    (["momentum=1"], r"momentum=1 must be in \[0, 1\)", ["momentum=0.9"]),
    (["augment.random_erasing=2"], r"augment.random_erasing=2 is a probability",
     ["augment.random_erasing=0.25"]),
    (["augment.label_smoothing=1"], r"augment.label_smoothing=1 must be in \[0, 1\)",
     ["augment.label_smoothing=0.1"]),
    (["augment.mixup_alpha=-1"], r"augment.mixup_alpha=-1 must be >= 0",
     ["augment.mixup_alpha=0.8"]),
    (["augment.crop_padding=-1"], r"augment.crop_padding=-1 must be >= 0",
     ["augment.crop_padding=0"]),
    (["std=[0]"], r"std=\[0\] must be > 0", ["std=[0.5]"]),
    (["mean=[0.5,0.5]", "std=[0.5,0.5]"], r"2 values but the model takes 1 channel",
     ["mean=[0.5]", "std=[0.5]"]),
    (["data=cifar"], r"data='cifar' is not a data source.*Did you mean 'cifar10'",
     ["data=cifar10"]),
    (["log=[\"csv\",\"wandb\"]"], r"unknown formats: use any of csv, jsonl, tensorboard",
     ["log=[\"csv\",\"jsonl\"]"]),
    (["resolution_schedule=[[0,3],[0.5,8]]"], r"side 3 must be a multiple of the patch size 2",
     ["resolution_schedule=[[0,4],[0.5,8]]"]),
    (["resolution_schedule=[[0,4],[1.5,8]]"], r"start at fraction 0 and increase",
     ["resolution_schedule=[[0,4],[0.5,8]]"]),
    (["device=gpu"], r"device='gpu' is not a device name: use device=auto", ["device=auto"]),
    (["out_dir= "], r"out_dir=' ' is empty", ["out_dir=runs/x"]),
]


@pytest.mark.parametrize(("bad", "message", "fix"), CHECKS,
                         ids=[" ".join(bad) for bad, _, _ in CHECKS])
def test_each_bad_setting_has_one_message_and_its_advice_works(bad, message, fix):
    with pytest.raises(ConfigError, match=message):
        load_train_config("digits", bad)
    load_train_config("digits", [*bad, *fix])  # later overrides win


def test_the_python_api_is_checked_at_construction():
    for kwargs, message in (({"batch_size": 0}, "batch_size=0 must be >= 1"),
                            ({"epochs": -1}, "epochs=-1 must be > 0"),
                            ({"ema_decay": 1.5}, r"ema_decay=1.5 must be in \[0, 1\)"),
                            ({"device": "gpu"}, "not a device name"),
                            ({"augment": {"flip": "no"}}, "augment.flip='no' is not valid")):
        with pytest.raises(ConfigError, match=message):
            TrainConfig(**kwargs)
    assert TrainConfig(ema_decay=None).ema_decay is None  # None is "off", like 0


def test_cuda_without_a_gpu_is_refused_before_any_data_is_read(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # The data folder does not exist: the device message must come first.
    code = main(["train", "digits", "device=cuda", "data=cifar10", "--data-dir",
                 str(tmp_path / "nowhere"), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "device='cuda' but this machine has no usable CUDA GPU" in err
    assert "use device=cpu or device=auto" in err and "Traceback" not in err
    assert "nowhere" not in err
    load_train_config("digits", ["device=cpu"])  # the advice works


def test_a_gpu_index_past_the_last_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError, match=r"device='cuda:1' but this machine has 1 GPU\(s\), "
                                          r"cuda:0 to cuda:0"):
        load_train_config("digits", ["device=cuda:1"])
    assert load_train_config("digits", ["device=cuda:0"]).device == "cuda:0"


@pytest.mark.parametrize(("override", "message"), [
    ("epochs=-1", "epochs=-1 must be > 0"),  # used to train one step and exit 0
    ("batch_size=0", "batch_size=0 must be >= 1"),  # used to end in ZeroDivisionError
    ("device=gpu", "device='gpu' is not a device name"),
    ("accum_steps=0", "accum_steps=0 must be >= 1"),
])
def test_cli_refuses_bad_settings_before_training(override, message, tmp_path, capsys):
    assert main(["train", "digits", override, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert not (tmp_path / "last.pt").exists()


def test_shipped_recipes_pass_their_own_checks():
    for name in ("digits", "cifar10", "cifar10-tutorial", "finetune"):
        assert load_train_config(name).batch_size >= 1


def test_a_shrinking_resolution_schedule_is_refused_naming_the_fix():
    """A training step never shrinks the images, so a shrinking schedule would be announced
    ("8 px from 0% -> 4 px from 50%") and train every step at 8 px."""
    with pytest.raises(ConfigError, match=r"resolution_schedule sides \[8, 4\] shrink: a run's "
                                          r"image size only grows"):
        load_train_config("digits", ["resolution_schedule=[[0, 8], [0.5, 4]]"])
    cfg = load_train_config("digits", ["resolution_schedule=[[0, 4], [0.5, 8]]"])  # advised
    assert cfg.resolution_schedule == [[0, 4], [0.5, 8]]


@pytest.mark.parametrize("side, words", [(50000, "needs about"),
                                         (1e9, "needs more memory than any machine has")])
def test_a_schedule_side_too_large_for_memory_is_refused_before_anything_runs(tmp_path, side,
                                                                              words):
    cfg = load_train_config("digits", [f"resolution_schedule=[[0, {side}]]", "total_steps=2",
                                       "warmup_steps=0", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError, match=rf"{words}.*the resolution_schedule's sides"):
        build_run(cfg)
