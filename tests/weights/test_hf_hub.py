"""`hf-hub:ORG/NAME` through huggingface_hub's cache, never the network.

Each test builds a Hugging Face cache in the library's own layout (models--ORG--NAME/refs/main
holding a commit hash, snapshots/<hash>/<files>) in a temporary HF_HOME, sets
HF_HUB_OFFLINE=1, and loads through huggingface_hub's real `hf_hub_download`. The repositories
hold tiny models written by the reference libraries themselves (transformers'
`save_pretrained`, timm's `save_for_hf`, as `push_to_hf_hub` uploads them); vitkit's logits
must equal the reference library's on the same input within 1e-5 (fp32).
"""

import json
import re
import shutil
from pathlib import Path

import httpx2
import huggingface_hub.file_download as hf_file_download
import numpy as np
import pytest
import timm
import torch
from huggingface_hub.errors import GatedRepoError, RepositoryNotFoundError
from PIL import Image
from timm.models._hub import save_for_hf
from transformers import ViTConfig as HFViTConfig
from transformers import ViTForImageClassification, ViTImageProcessor

from vitkit.catalog import config_of, load_pretrained, read_weights
from vitkit.cli import main
from vitkit.errors import CheckpointError, WeightsNotFoundError
from vitkit.weights.formats import hf_hub as hf_hub_format

TOL = 1e-5
COMMIT = "0123456789abcdef0123456789abcdef01234567"
HF_REPO, TIMM_REPO = "acme/tiny-vit", "acme/tiny-timm-vit"
LABELS = ["ant", "bee", "cat", "dog", "eel"]


def snapshot(cache: Path, repo: str, commit: str = COMMIT) -> Path:
    """The snapshot folder of `repo` at `commit` in huggingface_hub's cache layout, with
    refs/main pointing at it (file_download.py: storage folder, refs/, snapshots/)."""
    storage = cache / f"models--{repo.replace('/', '--')}"
    (storage / "refs").mkdir(parents=True, exist_ok=True)
    (storage / "refs" / "main").write_text(commit)
    folder = storage / "snapshots" / commit
    folder.mkdir(parents=True, exist_ok=True)
    return folder


@pytest.fixture
def hf_cache(tmp_path, monkeypatch) -> Path:
    """An empty cache under a temporary HF_HOME, offline; any download attempt fails."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.delenv("HF_HUB_CACHE", raising=False)
    monkeypatch.delenv("VITKIT_OFFLINE", raising=False)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")

    def no_network(*args, **kwargs):
        raise AssertionError("a download was attempted")

    monkeypatch.setattr(hf_file_download, "http_get", no_network)
    monkeypatch.setattr(hf_file_download, "get_hf_file_metadata", no_network)
    return tmp_path / "hf" / "hub"


def hf_model() -> ViTForImageClassification:
    config = HFViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                         num_attention_heads=4, intermediate_size=128, num_labels=len(LABELS),
                         id2label=dict(enumerate(LABELS)))
    return ViTForImageClassification(config).eval()


def write_hf_repo(cache: Path, model: ViTForImageClassification, commit: str = COMMIT) -> Path:
    folder = snapshot(cache, HF_REPO, commit)
    model.save_pretrained(folder)  # config.json + model.safetensors, as pushed to the Hub
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.4, 0.5, 0.6],
                      image_std=[0.2, 0.25, 0.3], resample=3).save_pretrained(folder)
    return folder


def timm_model() -> torch.nn.Module:
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32,
                             patch_size=8, depth=2, num_classes=len(LABELS)).eval()


def write_timm_repo(cache: Path, model: torch.nn.Module) -> Path:
    folder = snapshot(cache, TIMM_REPO)
    data = {"mean": (0.1, 0.2, 0.3), "std": (0.3, 0.2, 0.1), "crop_pct": 0.8,
            "interpolation": "bilinear", "input_size": (3, 32, 32)}
    save_for_hf(model, str(folder), safe_serialization=True, data_config=data,
                model_config={"label_names": LABELS})
    return folder


# -- loading ------------------------------------------------------------------------------------
def test_transformers_repo_loads_from_the_cache_with_equal_logits(hf_cache):
    reference = hf_model()
    write_hf_repo(hf_cache, reference)
    model = load_pretrained(f"hf-hub:{HF_REPO}")
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        expected = reference(pixel_values=images).logits
        assert (model(images) - expected).abs().max().item() <= TOL
    assert model.class_names == LABELS
    processor = json.loads((snapshot(hf_cache, HF_REPO) / "preprocessor_config.json")
                           .read_text())
    assert model.preprocess.mean == pytest.approx(processor["image_mean"])
    assert model.preprocess.std == pytest.approx(processor["image_std"])
    assert model.preprocess.interpolation == "bicubic"  # PIL code 3


def test_timm_repo_loads_with_equal_logits_and_its_pretrained_cfg(hf_cache):
    reference = timm_model()
    folder = write_timm_repo(hf_cache, reference)
    saved = json.loads((folder / "config.json").read_text())["pretrained_cfg"]
    model = load_pretrained(f"hf-hub:{TIMM_REPO}")
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert (model(images) - reference(images)).abs().max().item() <= TOL
    preprocess = model.preprocess
    assert (preprocess.mean, preprocess.std) == (tuple(saved["mean"]), tuple(saved["std"]))
    assert (preprocess.crop_pct, preprocess.interpolation) == \
        (saved["crop_pct"], saved["interpolation"])
    assert preprocess.img_size == tuple(saved["input_size"][1:])
    assert model.class_names == LABELS


def test_a_revision_picks_that_snapshot(hf_cache):
    old, new = hf_model(), hf_model()
    other = "f" * 40
    write_hf_repo(hf_cache, old, commit=other)
    write_hf_repo(hf_cache, new)  # refs/main -> COMMIT
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        pinned = load_pretrained(f"hf-hub:{HF_REPO}@{other}")(images)
        main_ = load_pretrained(f"hf-hub:{HF_REPO}")(images)
        assert (pinned - old(pixel_values=images).logits).abs().max().item() <= TOL
        assert (main_ - new(pixel_values=images).logits).abs().max().item() <= TOL


def test_read_weights_and_config_of_take_hub_names(hf_cache):
    write_hf_repo(hf_cache, hf_model())
    record = read_weights(f"hf-hub:{HF_REPO}")
    assert record.origin == "huggingface" and record.path.parent.name == COMMIT
    assert config_of(f"hf-hub:{HF_REPO}").width == 64


def test_a_later_hf_home_applies(hf_cache, tmp_path, monkeypatch):
    # the environment is read at call time, not when huggingface_hub was imported
    moved = tmp_path / "elsewhere"
    monkeypatch.setenv("HF_HUB_CACHE", str(moved))
    write_hf_repo(moved, hf_model())
    assert read_weights(f"hf-hub:{HF_REPO}").path.is_relative_to(moved)


# -- errors, each followed by its advice ---------------------------------------------------------
def test_offline_with_nothing_cached_says_where_and_how(hf_cache):
    with pytest.raises(WeightsNotFoundError) as info:
        load_pretrained(f"hf-hub:{HF_REPO}")
    message = str(info.value)
    assert "HF_HUB_OFFLINE" in message and f"hf download {HF_REPO}" in message
    cache = Path(re.search(r"cache at (\S+) and", message).group(1))
    assert cache == hf_cache
    write_hf_repo(cache, hf_model())  # what `hf download` on a connected machine leaves
    assert load_pretrained(f"hf-hub:{HF_REPO}").config.width == 64


def test_offline_advice_for_a_revision_downloads_that_revision(hf_cache):
    """Offline, a repository cached at main but asked for at `@v1.0` gets advice naming
    `--revision v1.0` (`hf download ORG/NAME` alone caches main), and that advice works."""
    write_hf_repo(hf_cache, hf_model())  # main is cached
    with pytest.raises(WeightsNotFoundError) as info:
        load_pretrained(f"hf-hub:{HF_REPO}@v1.0")
    message = str(info.value)
    assert f"`hf download {HF_REPO} --revision v1.0`" in message
    # what that command leaves: refs/v1.0 naming the tagged commit's snapshot
    tagged = "c" * 40
    write_hf_repo(hf_cache, hf_model(), commit=tagged)
    storage = hf_cache / f"models--{HF_REPO.replace('/', '--')}"
    (storage / "refs" / "main").write_text(COMMIT)
    (storage / "refs" / "v1.0").write_text(tagged)
    record = read_weights(f"hf-hub:{HF_REPO}@v1.0")
    assert record.path.parent.name == tagged


def test_offline_without_the_weights_file_names_both(hf_cache):
    folder = write_hf_repo(hf_cache, hf_model())
    weights = folder / "model.safetensors"
    saved = weights.read_bytes()
    weights.unlink()
    with pytest.raises(WeightsNotFoundError, match=r"model\.safetensors or pytorch_model\.bin"):
        load_pretrained(f"hf-hub:{HF_REPO}")
    weights.write_bytes(saved)
    assert load_pretrained(f"hf-hub:{HF_REPO}").config.depth == 2


def test_a_sharded_repository_loads_through_its_index_and_a_missing_shard_is_named(hf_cache):
    """A repository pushed by save_pretrained(max_shard_size=...) (model.safetensors.index.json
    and its shards, no model.safetensors) loads through its index; a missing shard is named."""

    reference = hf_model()
    folder = snapshot(hf_cache, HF_REPO)
    reference.save_pretrained(folder, max_shard_size="60KB")
    shards = sorted(folder.glob("model-*-of-*.safetensors"))
    assert len(shards) > 1 and not (folder / "model.safetensors").exists()
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = reference(pixel_values=images).logits
        assert (load_pretrained(f"hf-hub:{HF_REPO}")(images) - expected).abs().max() <= TOL
    saved = shards[-1].read_bytes()
    shards[-1].unlink()
    with pytest.raises(WeightsNotFoundError) as info:
        load_pretrained(f"hf-hub:{HF_REPO}")
    assert f"{shards[-1].name} is not in the Hugging Face cache" in str(info.value)
    assert f"hf download {HF_REPO}" in str(info.value)
    shards[-1].write_bytes(saved)  # as `hf download` on a connected machine leaves it
    with torch.no_grad():
        assert (load_pretrained(f"hf-hub:{HF_REPO}")(images) - expected).abs().max() <= TOL


@pytest.mark.parametrize("config, holds", [
    ({"model_type": "bert", "hidden_size": 64}, "'bert' model"),
    ({"architecture": "resnet50", "pretrained_cfg": {}}, "timm resnet50"),
])
def test_a_repository_without_a_vit_says_what_it_holds(hf_cache, config, holds):
    folder = snapshot(hf_cache, "acme/not-a-vit")
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError) as info:
        load_pretrained("hf-hub:acme/not-a-vit")
    message = str(info.value)
    assert holds in message and 'model_type "vit"' in message
    assert not (folder / "model.safetensors").exists()  # no weights fetched for a non-ViT
    write_hf_repo(hf_cache, hf_model())  # a repository of the kind the message names
    assert load_pretrained(f"hf-hub:{HF_REPO}").config.num_classes == len(LABELS)


def test_a_repository_without_config_json(hf_cache):
    folder = snapshot(hf_cache, "acme/weights-only")
    no_exist = folder.parent.parent / ".no_exist" / COMMIT
    no_exist.mkdir(parents=True)
    (no_exist / "config.json").touch()  # how huggingface_hub records a file the Hub lacks
    with pytest.raises(CheckpointError, match=r"holds no config\.json.*vitkit reads"):
        load_pretrained("hf-hub:acme/weights-only")


@pytest.mark.parametrize("error, advice", [
    (RepositoryNotFoundError, "no such repository on the Hub, or it is private"),
    (GatedRepoError, "gated repository"),
])
def test_missing_private_or_gated_repositories(hf_cache, monkeypatch, error, advice):
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setattr(hf_hub_format, "hub_unreachable", lambda: None)  # a Hub that answers

    def refuse(url, *args, **kwargs):
        response = httpx2.Response(401, request=httpx2.Request("HEAD", url))
        raise error("401 Client Error", response=response)

    monkeypatch.setattr(hf_file_download, "get_hf_file_metadata", refuse)
    with pytest.raises(WeightsNotFoundError) as info:
        load_pretrained("hf-hub:acme/tiny-vitt")
    assert advice in str(info.value) and "HF_TOKEN" in str(info.value)
    assert info.value.__cause__ is None  # no huggingface_hub traceback under ours
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    write_hf_repo(hf_cache, hf_model())  # the name fixed (and the files reachable)
    assert load_pretrained(f"hf-hub:{HF_REPO}").config.width == 64


def test_a_malformed_name_shows_the_form():
    with pytest.raises(WeightsNotFoundError, match="hf-hub:ORG/NAME"):
        load_pretrained("hf-hub:just-a-name")


# -- a bare ORG/NAME, as Hugging Face users write it ----------------------------------------------
def test_a_bare_repo_id_in_the_cache_loads_as_its_hf_hub_name(hf_cache):
    write_hf_repo(hf_cache, hf_model())
    bare, prefixed = load_pretrained(HF_REPO), load_pretrained(f"hf-hub:{HF_REPO}")
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(bare(images), prefixed(images))
    assert bare.class_names == LABELS
    assert config_of(HF_REPO).width == 64


def test_a_bare_repo_id_not_cached_is_told_the_hf_hub_name_and_that_works(hf_cache):
    with pytest.raises(WeightsNotFoundError) as info:
        load_pretrained(HF_REPO)
    message = str(info.value)
    assert "downloads" in message and "local folder" in message
    suggested = re.search(r"write (hf-hub:\S+),", message).group(1)
    assert suggested == f"hf-hub:{HF_REPO}"
    write_hf_repo(hf_cache, hf_model())  # what that download leaves in the cache
    assert load_pretrained(suggested).config.width == 64


def test_from_pretrained_takes_hub_names_bare_or_prefixed(hf_cache):
    from vitkit import VisionTransformer

    reference = hf_model()
    write_hf_repo(hf_cache, reference)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = reference(pixel_values=images).logits
        for source in (f"hf-hub:{HF_REPO}", HF_REPO):
            model = VisionTransformer.from_pretrained(source)
            assert (model(images) - expected).abs().max().item() <= TOL
    assert VisionTransformer.from_pretrained(HF_REPO, num_classes=2).config.num_classes == 2


def test_a_bare_repo_id_never_shadows_a_local_folder_or_a_variant(hf_cache, tmp_path,
                                                                   monkeypatch):
    write_hf_repo(hf_cache, hf_model())
    monkeypatch.chdir(tmp_path)
    local = hf_model()
    local.config.num_labels = 3
    ViTForImageClassification(local.config).save_pretrained(tmp_path / HF_REPO)
    assert load_pretrained(HF_REPO).config.num_classes == 3  # the folder, not the cache
    assert config_of("Ti/16").width == 192  # "Ti/16" is a variant, whatever the cache holds


# -- the CLI -------------------------------------------------------------------------------------
def test_cli_summary_and_predict_take_hub_names(hf_cache, tmp_path, capsys):
    write_hf_repo(hf_cache, hf_model())
    assert main(["summary", f"hf-hub:{HF_REPO}"]) in (0, None)
    assert "blocks.1" in capsys.readouterr().out
    image = tmp_path / "x.png"
    Image.fromarray(np.random.default_rng(0).integers(0, 255, (40, 40, 3), np.uint8)).save(image)
    assert main(["predict", f"hf-hub:{HF_REPO}", str(image)]) in (0, None)
    out = capsys.readouterr().out
    assert any(label in out for label in LABELS)


def test_cli_finetunes_from_a_hub_repository(hf_cache, tmp_path):
    # a 1-channel 8-px ViT, as for the 8x8 digits, fine-tuned at 16 px (position grid 2x2->4x4)
    config = HFViTConfig(image_size=8, patch_size=4, num_channels=1, hidden_size=32,
                         num_hidden_layers=2, num_attention_heads=2, intermediate_size=64,
                         num_labels=10)
    ViTForImageClassification(config).save_pretrained(snapshot(hf_cache, "acme/digits-vit"))
    out = tmp_path / "run"
    code = main(["finetune", "hf-hub:acme/digits-vit", "data=digits", "model.img_size=16",
                 "batch_size=64", "total_steps=10", "warmup_steps=2", "progress=false",
                 "--out", str(out)])
    assert code in (0, None)
    tuned = load_pretrained(out / "last.pt")
    assert tuned.config.img_size == (16, 16) and tuned.config.width == 32
    assert tuned.pos_embed.shape[1] == 1 + 16


# -- docs/weights.md, "hf-hub: on a machine without internet", followed step by step -------------
def random_image(path: Path) -> Path:
    Image.fromarray(np.random.default_rng(1).integers(0, 255, (40, 40, 3), np.uint8)).save(path)
    return path


def test_a_cache_filled_online_and_copied_over_loads_with_hf_hub_offline(hf_cache, tmp_path,
                                                                         capsys):
    # online: `hf download acme/tiny-vit config.json model.safetensors preprocessor_config.json`
    # fills ~/.cache/huggingface/hub there (write_hf_repo leaves what it leaves)
    online_cache = tmp_path / "online" / "huggingface" / "hub"
    reference = hf_model()
    write_hf_repo(online_cache, reference)
    # copy the cache folder to the same place on the offline machine; HF_HUB_OFFLINE=1 (fixture)
    shutil.copytree(online_cache, hf_cache, symlinks=True)
    image = random_image(tmp_path / "cat.png")
    assert main(["predict", f"hf-hub:{HF_REPO}", str(image)]) in (0, None)
    assert any(label in capsys.readouterr().out for label in LABELS)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = reference(pixel_values=images).logits
        assert (load_pretrained(f"hf-hub:{HF_REPO}")(images) - expected).abs().max() <= TOL


def test_a_folder_downloaded_with_local_dir_loads_without_the_hub(hf_cache, tmp_path, capsys):
    # online: `hf download acme/tiny-vit config.json model.safetensors preprocessor_config.json
    # --local-dir tiny-vit`, then the folder is copied to the offline machine
    folder = tmp_path / "tiny-vit"
    reference = hf_model()
    reference.save_pretrained(folder)
    ViTImageProcessor(size={"height": 32, "width": 32}, image_mean=[0.4, 0.5, 0.6],
                      image_std=[0.2, 0.25, 0.3], resample=3).save_pretrained(folder)
    metadata = folder / ".cache" / "huggingface" / "download"  # what --local-dir leaves beside
    metadata.mkdir(parents=True)
    (metadata / "config.json.metadata").write_text(f"{COMMIT}\netag\n0\n")
    image = random_image(tmp_path / "cat.png")
    assert main(["predict", str(folder), str(image)]) in (0, None)
    assert any(label in capsys.readouterr().out for label in LABELS)
    model = load_pretrained(folder)
    assert model.preprocess.mean == pytest.approx([0.4, 0.5, 0.6])
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = reference(pixel_values=images).logits
        assert (model(images) - expected).abs().max() <= TOL
    assert not any(hf_cache.glob("models--*"))  # the Hub cache was never needed
