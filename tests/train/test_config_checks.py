"""Training configs are checked where they enter (recipe, overrides, Python): each bad
setting gets one message naming it, and the fix the message suggests works."""


import pytest
import torch

from vitkit import ConfigError
from vitkit.cli import main
from vitkit.train.config import TrainConfig, load_train_config
from vitkit.train.setup import build_run


def says(text: str, *parts: str) -> None:
    """Assert that a message names each of `parts` (case-insensitive), showing it if not."""
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"{missing} not in message: {text!r}"


# (bad overrides of the digits recipe, what the message names: the setting and its fix,
# overrides that follow its advice)
CHECKS = [
    (["epochs=-1"], ("epochs=-1", "> 0"), ["epochs=0.5", "warmup_epochs=0.1"]),
    (["epochs=0"], ("epochs=0", "> 0", "total_steps=N"), ["epochs=1", "total_steps=5"]),
    (["total_steps=-5"], ("total_steps=-5", ">= 0"), ["total_steps=0"]),
    (["batch_size=0"], ("batch_size=0", ">= 1", "batch_size=64"), ["batch_size=64"]),
    (["batch_size=-8"], ("batch_size=-8", ">= 1"), ["batch_size=64"]),
    (["lr=-0.001"], ("lr=-0.001", ">= 0", "lr=0.001"), ["lr=0.001"]),
    (["weight_decay=-0.1"], ("weight_decay=-0.1", ">= 0"), ["weight_decay=0.05"]),
    (["total_steps=10", "warmup_steps=20"], ("warmup_steps=20", "longer than the run",
                                             "total_steps=10", "lower warmup_steps"),
     ["warmup_steps=1"]),
    (["epochs=1"], ("warmup_epochs=2", "longer than the run", "epochs=1", "warmup_epochs=0.1"),
     ["warmup_epochs=0.1"]),
    (["warmup_epochs=-1"], ("warmup_epochs=-1", ">= 0"), ["warmup_epochs=0"]),
    (["warmup_steps=-1"], ("warmup_steps=-1", ">= 0", "null"), ["warmup_steps=null"]),
    (["accum_steps=3"], ("batch_size 64", "not divisible", "accum_steps 3", "[1, 2, 4, 8"),
     ["accum_steps=4"]),
    (["accum_steps=0"], ("accum_steps=0", ">= 1"), ["accum_steps=1"]),
    (["ema_decay=1"], ("ema_decay=1", "[0, 1)", "0.9999"), ["ema_decay=0.9999"]),
    (["ema_decay=-0.5"], ("ema_decay=-0.5", "[0, 1)", "0 or null"), ["ema_decay=0"]),
    (["time_budget=-1"], ("time_budget=-1", ">= 0", "seconds"), ["time_budget=0"]),
    (["model.img_size=1"], ("image size 1x1", "patch size 2", "at least 2x2"),
     ["model.img_size=2"]),
    (["model.img_size=0"], ("image size 0x0", "patch size 2"), ["model.img_size=8"]),
    (["eval_every=0"], ("eval_every=0", ">= 1"), ["eval_every=1"]),
    (["eval_batch_size=0"], ("eval_batch_size=0", ">= 1"), ["eval_batch_size=500"]),
    (["tta=mirror"], ("tta='mirror'", "none, flip"), ["tta=flip"]),
    (["threads=0"], ("threads=0", ">= 1", "null"), ["threads=null"]),
    (["train_limit=0"], ("train_limit=0", ">= 1", "null"), ["train_limit=null"]),
    (["min_lr_ratio=2"], ("min_lr_ratio=2", "[0, 1]"), ["min_lr_ratio=0.1"]),
    (["clip_grad=-1"], ("clip_grad=-1", ">= 0"), ["clip_grad=0"]),
    (["betas=[0.9,1.5]"], ("betas=[0.9, 1.5]", "[0, 1)", "betas=[0.9,0.999]"),
     ["betas=[0.9,0.999]"]),
    (["momentum=1"], ("momentum=1", "[0, 1)", "0.9"), ["momentum=0.9"]),
    (["augment.random_erasing=2"], ("augment.random_erasing=2", "probability", "0.25"),
     ["augment.random_erasing=0.25"]),
    (["augment.label_smoothing=1"], ("augment.label_smoothing=1", "[0, 1)", "0.1"),
     ["augment.label_smoothing=0.1"]),
    (["augment.mixup_alpha=-1"], ("augment.mixup_alpha=-1", ">= 0", "0.8"),
     ["augment.mixup_alpha=0.8"]),
    (["augment.crop_padding=-1"], ("augment.crop_padding=-1", ">= 0"),
     ["augment.crop_padding=0"]),
    (["std=[0]"], ("std=[0]", "> 0"), ["std=[0.5]"]),
    (["mean=[0.5,0.5]", "std=[0.5,0.5]"], ("mean", "std", "2 values", "1 channel"),
     ["mean=[0.5]", "std=[0.5]"]),
    (["data=cifar"], ("data='cifar'", "not a data source", "'cifar10'"), ["data=cifar10"]),
    (["log=[\"csv\",\"wandb\"]"], ("wandb", "unknown formats", "csv, jsonl, tensorboard"),
     ["log=[\"csv\",\"jsonl\"]"]),
    (["resolution_schedule=[[0,3],[0.5,8]]"], ("resolution_schedule", "side 3",
                                               "multiple of the patch size 2"),
     ["resolution_schedule=[[0,4],[0.5,8]]"]),
    (["resolution_schedule=[[0,4],[1.5,8]]"], ("resolution_schedule", "fraction 0",
                                               "increase"),
     ["resolution_schedule=[[0,4],[0.5,8]]"]),
    (["device=gpu"], ("device='gpu'", "not a device name", "device=auto"), ["device=auto"]),
    (["out_dir= "], ("out_dir=' '", "empty"), ["out_dir=runs/x"]),
]


@pytest.mark.parametrize(("bad", "parts", "fix"), CHECKS,
                         ids=[" ".join(bad) for bad, _, _ in CHECKS])
def test_each_bad_setting_has_one_message_and_its_advice_works(bad, parts, fix):
    with pytest.raises(ConfigError) as caught:
        load_train_config("digits", bad)
    says(str(caught.value), *parts)
    load_train_config("digits", [*bad, *fix])  # later overrides win


def test_the_python_api_is_checked_at_construction():
    for kwargs, parts in (({"batch_size": 0}, ("batch_size=0", ">= 1")),
                          ({"epochs": -1}, ("epochs=-1", "> 0")),
                          ({"ema_decay": 1.5}, ("ema_decay=1.5", "[0, 1)")),
                          ({"device": "gpu"}, ("device='gpu'", "not a device name")),
                          ({"augment": {"flip": "no"}}, ("augment.flip='no'", "not valid"))):
        with pytest.raises(ConfigError) as caught:
            TrainConfig(**kwargs)
        says(str(caught.value), *parts)
    assert TrainConfig(ema_decay=None).ema_decay is None  # None is "off", like 0


def test_cuda_without_a_gpu_is_refused_before_any_data_is_read(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    # The data folder does not exist: the device message must come first.
    code = main(["train", "digits", "device=cuda", "data=cifar10", "--data-dir",
                 str(tmp_path / "nowhere"), "--out", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert code == 2 and "Traceback" not in err
    says(err, "device='cuda'", "no usable CUDA GPU", "device=cpu", "device=auto")
    assert "nowhere" not in err
    load_train_config("digits", ["device=cpu"])  # the advice works


def test_a_gpu_index_past_the_last_gpu_is_refused(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ConfigError) as caught:
        load_train_config("digits", ["device=cuda:1"])
    says(str(caught.value), "device='cuda:1'", "1 GPU(s)", "cuda:0 to cuda:0")
    assert load_train_config("digits", ["device=cuda:0"]).device == "cuda:0"


@pytest.mark.parametrize(("override", "parts"), [
    ("epochs=-1", ("epochs=-1", "> 0")),
    ("batch_size=0", ("batch_size=0", ">= 1")),
    ("device=gpu", ("device='gpu'", "not a device name")),
    ("accum_steps=0", ("accum_steps=0", ">= 1")),
])
def test_cli_refuses_bad_settings_before_training(override, parts, tmp_path, capsys):
    """A bad setting on the command line exits 2 with its message, before any training."""
    assert main(["train", "digits", override, "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    says(err, *parts)
    assert "Traceback" not in err
    assert not (tmp_path / "last.pt").exists()


def test_shipped_recipes_pass_their_own_checks():
    for name in ("digits", "cifar10", "cifar10-tutorial", "finetune"):
        assert load_train_config(name).batch_size >= 1


def test_a_shrinking_resolution_schedule_is_refused_naming_the_fix():
    """A run's image size only grows, so a schedule whose sides shrink is refused, naming the
    sides; a growing schedule is taken."""
    with pytest.raises(ConfigError) as caught:
        load_train_config("digits", ["resolution_schedule=[[0, 8], [0.5, 4]]"])
    says(str(caught.value), "resolution_schedule", "[8, 4]", "shrink", "only grows")
    cfg = load_train_config("digits", ["resolution_schedule=[[0, 4], [0.5, 8]]"])  # advised
    assert cfg.resolution_schedule == [[0, 4], [0.5, 8]]


@pytest.mark.parametrize("side, words", [(50000, "needs about"),
                                         (1e9, "needs more memory than any machine has")])
def test_a_schedule_side_too_large_for_memory_is_refused_before_anything_runs(tmp_path, side,
                                                                              words):
    cfg = load_train_config("digits", [f"resolution_schedule=[[0, {side}]]", "total_steps=2",
                                       "warmup_steps=0", f"out_dir={tmp_path}"])
    with pytest.raises(ConfigError) as caught:
        build_run(cfg)
    says(str(caught.value), words, "GiB available", "lower batch_size",
         "resolution_schedule's sides")
    # the advice followed: lower sides build the run
    cfg = load_train_config("digits", ["resolution_schedule=[[0, 8]]", "total_steps=2",
                                       "warmup_steps=0", f"out_dir={tmp_path}"])
    assert build_run(cfg).model.config.img_size == (8, 8)
