"""One catalog of names: `lookup` says what a string names, and every door that takes a name
(`config_of`, `create_model`, `count_parameters`, `vitkit summary`, `vitkit models`,
`vitkit benchmark`, `load_pretrained`) gives the same answer for it: a name or path that
names nothing gets the one it most likely meant (a mistyped run folder or file on every verb
that takes weights, a few names for an unknown one, never the whole list), and `create_model`
of a weights file says that `load_pretrained` reads its weights. Nothing is downloaded: named
checkpoints are built from the architecture their name implies."""

import json
import logging
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
import timm
import torch
from PIL import Image
from safetensors.torch import save_file

import vitkit
from vitkit.catalog import (
    all_names,
    checkpoint_rows,
    config_of,
    count_parameters,
    create_model,
    load_pretrained,
    looks_like_path,
    lookup,
    model_rows,
)
from vitkit.cli import main
from vitkit.config import ViTConfig
from vitkit.errors import ConfigError, WeightsNotFoundError
from vitkit.inference.benchmark.source import load_benchmark_model
from vitkit.weights import save_npz, save_pretrained
from vitkit.weights.formats import hub

COMMIT = "0123456789abcdef0123456789abcdef01234567"
HUB_REPO = "acme/tiny-vitkit"


@pytest.fixture
def no_download(tmp_path, monkeypatch):
    """Downloads off and impossible; the vitkit cache empty (and checked empty after)."""
    def refuse(*args, **kwargs):
        raise AssertionError("a download was attempted")

    cache = tmp_path / "cache"
    monkeypatch.setenv("VITKIT_OFFLINE", "1")
    monkeypatch.setenv("VITKIT_CACHE", str(cache))
    monkeypatch.setattr(hub, "download_file", refuse)
    yield
    assert not cache.exists() or list(cache.iterdir()) == []


def summary_total(capsys, name: str) -> int:
    """The total `vitkit summary NAME` prints."""
    assert main(["summary", name]) in (0, None)
    out = capsys.readouterr().out
    line = next(line for line in out.splitlines() if line.startswith("Total params:"))
    return int(line.split()[2].replace(",", ""))


def listed_checkpoints(capsys) -> list[str]:
    """The names `vitkit models --checkpoints` prints, read from its output."""
    assert main(["models", "--checkpoints"]) in (0, None)
    lines = capsys.readouterr().out.splitlines()
    return [line.split()[0] for line in lines[1:] if line.startswith(tuple("TSBLHR"))]


def tiny() -> ViTConfig:
    return ViTConfig(img_size=32, patch_size=8, width=64, depth=2, num_heads=4, mlp_dim=128,
                     num_classes=5)


def hub_snapshot(home: Path, model: vitkit.VisionTransformer) -> None:
    """A vitkit folder pushed to the Hub, in huggingface_hub's cache layout under `home`."""
    storage = home / "hub" / f"models--{HUB_REPO.replace('/', '--')}"
    (storage / "refs").mkdir(parents=True)
    (storage / "refs" / "main").write_text(COMMIT)
    save_pretrained(model, storage / "snapshots" / COMMIT)


# -- every listed checkpoint builds at the size summary prints -------------------------------------
def test_every_listed_checkpoint_builds_with_the_count_summary_prints(capsys, no_download):
    names = listed_checkpoints(capsys)
    assert len(names) == len(checkpoint_rows()) >= 39
    for name in names:
        model = create_model(name, device="meta")
        counted = sum(p.numel() for p in model.parameters())
        assert count_parameters(name) == counted == summary_total(capsys, name), name
        assert model.config == hub.named_checkpoint_config(name), name


def test_models_table_counts_equal_summary_totals(capsys):
    for row in model_rows():
        assert row.params == summary_total(capsys, row.name), row.name
        assert row.config == config_of(row.name)


# -- one answer per name, whoever asks ------------------------------------------------------------
@pytest.fixture
def sources(tmp_path, monkeypatch) -> dict[str, str]:
    """A name of each kind `lookup` knows, beside the kind it is."""
    config_file = tmp_path / "tiny.json"
    tiny().to_json(config_file)
    folder = save_pretrained(create_model(tiny()), tmp_path / "folder")
    npz = save_npz(create_model(tiny().replace(act="gelu_tanh")), tmp_path / "tiny.npz")
    run = tmp_path / "run"
    run.mkdir()
    (run / "best.pt").write_bytes(b"")  # lookup only asks whether it is there
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    hub_snapshot(tmp_path / "hf", create_model(tiny().replace(num_classes=3)))
    return {"Ti/16": "variant", "cifar10-tutorial": "variant", "R+Ti/32": "variant",
            "vit_small_patch32_224": "variant", "Ti/16-augreg-i21k": "checkpoint",
            "ViT-B_32-i21k": "checkpoint", "R+Ti/16-augreg-i21k-i1k-384": "checkpoint",
            str(config_file): "config_file", str(folder): "weights", str(npz): "weights",
            str(run): "run_folder", f"hf-hub:{HUB_REPO}": "hub", "B/16x": "unknown"}


def test_lookup_names_each_kind(sources):
    for text, kind in sources.items():
        assert lookup(text).kind == kind, text
    assert lookup("ViT-B_32-i21k").key == "B/32-i21k"
    assert lookup("b32-i21k").key == "B/32-i21k"


@pytest.mark.parametrize("kind", ["variant", "checkpoint", "config_file", "weights", "hub"])
def test_config_of_summary_create_model_and_benchmark_agree(capsys, no_download, sources, kind):
    for name in [text for text, k in sources.items() if k == kind]:
        config = config_of(name)
        model = create_model(name, device="meta")
        assert model.config == config, name
        assert count_parameters(name) == summary_total(capsys, name), name
        benchmarked, origin = load_benchmark_model(name)
        assert benchmarked.config == config, name
        assert origin == ("random init" if kind in ("variant", "checkpoint", "config_file")
                          else f"weights {name}")
        if kind in ("weights", "hub"):
            assert load_pretrained(name).config == config


def test_overrides_apply_the_same_way_to_every_kind(sources):
    for name in ("Ti/16", "Ti/16-augreg-i21k", next(t for t, k in sources.items()
                                                    if k == "weights")):
        config = config_of(name, img_size=64, num_classes=7)
        assert (config.img_size, config.num_classes) == ((64, 64), 7)
        assert create_model(name, img_size=64, num_classes=7, device="meta").config == config


def test_create_model_builds_a_named_checkpoints_architecture():
    # config_of("B/16-i21k") and create_model agree on a checkpoint's name
    model = vitkit.create_model("B/16-i21k", device="meta")
    assert (model.config.num_classes, model.config.pre_logits_dim) == (21843, 768)


# -- unknown names -------------------------------------------------------------------------------
def test_an_unknown_name_gets_did_you_mean_from_every_door(capsys):
    for door in (config_of, create_model, count_parameters):
        with pytest.raises(ConfigError) as refused:
            door("B/16-i21x")
        says(refused.value, "unknown model", "'B/16-i21x'", "Did you mean", "'B/16-i21k'")
    with pytest.raises(ConfigError, match=r"Did you mean .*'B/16'"):
        load_benchmark_model("B/16x")
    assert main(["summary", "B/16-i21x"]) == 2
    says(capsys.readouterr().err, "B/16-i21x", "'B/16-i21k'")
    assert count_parameters("B/16-i21k") > 0  # the name it suggests is known
    with pytest.raises(WeightsNotFoundError, match=r"Did you mean .*'B/16-i21k'"):
        load_pretrained("B/16-i21x", download=False)


def test_a_variant_name_has_no_weights_to_load():
    with pytest.raises(WeightsNotFoundError, match="neither a file nor a known checkpoint"):
        load_pretrained("B/16", download=False)
    assert not lookup("B/16").has_weights and lookup("B/16-i21k").has_weights


def test_all_names_are_what_models_lists(capsys):
    assert main(["models"]) in (0, None)
    out = capsys.readouterr().out
    for row in model_rows():
        assert row.name in out and f"{row.params:,}" in out
    assert set(all_names()) == {row.name for row in model_rows()} | \
        {row.name for row in checkpoint_rows()}


def test_a_json_config_file_is_a_config_not_weights(tmp_path):
    path = tmp_path / "model.json"
    path.write_text(json.dumps({"img_size": 32, "patch_size": 4, "width": 48, "depth": 1,
                                "num_heads": 4, "mlp_dim": 96}))
    assert lookup(path).kind == "config_file" and not lookup(path).has_weights
    assert create_model(path).config.width == 48


# -- timm's tagged names ("vit_base_patch16_224.augreg_in21k") -------------------------------
def _timm_official_names() -> list[str]:
    timm = pytest.importorskip("timm")
    return [name for name in timm.list_pretrained("vit_*")
            if name.split(".")[-1] in ("augreg_in21k", "augreg_in21k_ft_in1k", "orig_in21k",
                                       "orig_in21k_ft_in1k")]


def test_timm_tagged_names_read_as_the_same_official_files(no_download, tmp_path):
    """A timm user names weights as timm does; each of timm's names of an official file
    (AugReg and the 2020 release) is read as vitkit's name of that file: the same URL where
    timm's config gives one, the same architecture, resolution and head (timm drops the 2020
    i21k heads: num_classes 0 there), and the same local file under --weights-dir."""
    from timm.models import get_pretrained_cfg

    names = _timm_official_names()
    assert len(names) == 39 and set(names) == set(hub.TIMM_NAMES)
    urls = hub.named_checkpoints()
    for name in names:
        named = lookup(name)
        assert named.kind == "checkpoint", name
        timm_cfg = get_pretrained_cfg(name)
        if "storage.googleapis.com" in (timm_cfg.url or ""):
            assert urls[named.key] == timm_cfg.url, name
        config = config_of(name)
        assert (3, *config.img_size) == tuple(timm_cfg.input_size), name
        assert config.num_classes == (timm_cfg.num_classes or 21843), name
        assert lookup(f"timm/{name}").key == named.key
    named = lookup("vit_base_patch16_224.augreg_in21k")
    with pytest.raises(WeightsNotFoundError, match=re.escape(urls["B/16-augreg-i21k"])):
        named.weights_path(tmp_path, False)
    (tmp_path / hub.local_filename("B/16-augreg-i21k")).write_bytes(b"npz")  # as advised
    assert named.weights_path(tmp_path, False) == tmp_path / hub.local_filename(
        "B/16-augreg-i21k")


@pytest.mark.parametrize("name", ["vit_tiny_patch16_384.augreg_in21k_ft_in1k",
                                  "vit_small_r26_s32_224.augreg_in21k",
                                  "vit_base_r50_s16_384.orig_in21k_ft_in1k"])
def test_timm_tagged_names_build_timms_parameter_count(name):
    timm = pytest.importorskip("timm")
    expected = sum(p.numel() for p in timm.create_model(name, pretrained=False).parameters())
    assert count_parameters(name) == expected


def test_timm_tags_of_no_official_file_say_where_timms_file_is(capsys):
    """timm's tagged names of its own fine-tunes ("augreg2_in21k_ft_in1k") that have no
    official file name timm's Hub file and the architecture (not a close name of another
    size), and the architecture's name builds."""
    name = "vit_base_patch16_224.augreg2_in21k_ft_in1k"
    with pytest.raises(ConfigError) as refused:
        create_model(name, device="meta")
    says(refused.value, "timm's name", "augreg2_in21k_ft_in1k",
         "hf-hub:timm/vit_base_patch16_224.augreg2_in21k_ft_in1k", "vit_base_patch16_224 ")
    assert "Did you mean" not in str(refused.value)
    with pytest.raises(WeightsNotFoundError, match=r"hf-hub:timm/vit_base_patch16_224\.augreg2"):
        load_pretrained(name, download=False)
    assert main(["summary", "vit_small_patch16_224.augreg_in1k"]) == 2
    err = capsys.readouterr().err
    assert "Did you mean" not in err and "hf-hub:timm/vit_small_patch16_224.augreg_in1k" in err
    assert count_parameters("vit_base_patch16_224") == 86_567_656


def test_a_missing_weights_file_named_like_timm_is_still_a_missing_file(tmp_path, capsys):
    """timm's tagged-name advice is for names, not files: a missing
    "vit_base_patch16_224.safetensors" is "no such file", with no Hub repository advised."""
    for name in ("vit_base_patch16_224.safetensors", "vit_small.pt", "vit_b16.npz"):
        with pytest.raises(WeightsNotFoundError, match="no such file or folder"):
            load_pretrained(str(tmp_path / name), download=False)
        assert main(["summary", name]) == 2
        err = capsys.readouterr().err
        assert "timm's name" not in err and "hf-hub:timm" not in err, err


TOL = 1e-5


def test_create_model_of_a_weights_file_warns_and_load_pretrained_reads_it(tmp_path, caplog):
    reference = timm.create_model("vit_tiny_patch16_224", img_size=32, num_classes=3).eval()
    path = tmp_path / "timm.safetensors"
    save_file(reference.state_dict(), path)
    with caplog.at_level(logging.WARNING):
        random = vitkit.create_model(path)
    assert f"load_pretrained('{path}') reads the weights" in caplog.text
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (random(images) - reference(images)).abs().max() > 1e-2
        loaded = vitkit.load_pretrained(path)  # the advice followed
        assert (loaded(images) - reference(images)).abs().max() <= TOL
    caplog.clear()
    with caplog.at_level(logging.WARNING):
        vitkit.create_model("Ti/16")
    assert "load_pretrained" not in caplog.text  # a variant name is an architecture


@pytest.fixture
def runs(digits_run: Path, tmp_path: Path) -> Path:
    """A folder holding runs/digits, a copy of the shared digits run, and digit.png, an image."""
    root = tmp_path / "workdir"
    shutil.copytree(digits_run, root / "runs" / "digits")
    pixels = np.zeros((8, 8), dtype=np.uint8)
    pixels[1:7, 3:5] = 255  # a light "1" on black
    Image.fromarray(pixels).save(root / "digit.png")
    return root


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("verb, after", [
    ("eval", []),
    ("predict", ["digit.png"]),
    ("summary", []),
    ("finetune", ["total_steps=1", "warmup_steps=0", "data=digits", "progress=false",
                  "--out", "tuned"]),
])
def test_a_mistyped_run_folder_suggests_the_one_that_exists(verb, after, runs, capsys,
                                                            monkeypatch):
    monkeypatch.chdir(runs)
    code, _, err = run(capsys, verb, "runs/digit", *after)
    assert code == 2
    assert err.strip() == f"vitkit {verb}: error: no such file or folder: runs/digit; did you " \
                          "mean runs/digits?"
    code, out, err = run(capsys, verb, "runs/digits", *after)  # the advice, followed
    assert code == 0, err
    assert out


def test_a_mistyped_file_in_a_run_folder_is_corrected_too(runs, capsys, monkeypatch):
    monkeypatch.chdir(runs)
    code, _, err = run(capsys, "eval", "runs/digits/bset.pt")
    assert code == 2 and "no such file or folder: runs/digits/bset.pt; did you mean " \
                         "runs/digits/best.pt?" in err
    code, _, err = run(capsys, "eval", "runs/digits/best.pt")
    assert code == 0, err
    code, _, err = run(capsys, "eval", "nowhere/at/all.pt")
    assert code == 2 and "no such file or folder: nowhere/at/all.pt (nowhere does not exist)" \
                         in err


def test_an_unknown_name_gets_a_few_suggestions_not_every_name(capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    Image.new("L", (8, 8)).save(tmp_path / "x.png")
    for verb in ("eval", "predict", "finetune", "summary"):
        argv = [verb, "B/16-i21x", *(["x.png"] if verb == "predict" else [])]
        code, _, err = run(capsys, *argv)
        assert code == 2 and len(err) < 600, err
        assert "Did you mean 'B/16-i21k'" in err and "`vitkit models" in err
        assert sum(f"'{name}'" in err for name in all_names()) <= 5  # not the list of 44
    code, out, _ = run(capsys, "models", "--checkpoints")  # the command the message names
    assert code == 0 and "B/16-i21k" in out and "R50+L/32-augreg-i21k" in out


def test_a_variant_or_a_config_is_not_mistaken_for_a_path(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "runs").mkdir()
    assert not looks_like_path("B/16-i21x") and not looks_like_path("R50+B/16")
    assert looks_like_path("runs/digit") and looks_like_path("model.pt")
    assert looks_like_path("./B/16") and looks_like_path("a/b/c")
    with pytest.raises(WeightsNotFoundError) as refused:
        load_pretrained("model.pt")
    says(refused.value, "no such file", "model.pt")
    assert "\n" not in str(refused.value)
    (tmp_path / "tiny.json").write_text("{}")
    with pytest.raises(ConfigError) as refused:
        config_of("tiyn.json")
    says(refused.value, "tiyn.json", "does not exist", "tiny.json")
    assert config_of("tiny.json") is not None  # the file it suggests reads


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"
