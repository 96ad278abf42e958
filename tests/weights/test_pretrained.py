"""`load_pretrained` on every format it recognises, resampling parity with timm, vitkit's own
format (`save_pretrained` writes a folder and one class name per output), named checkpoints
offline, and a clear error for every kind of bad file, with advice that works (another head
size: `load_pretrained(path, num_classes=N)`).

Tolerance: 1e-5 max abs difference on fp32 logits (observed: 0).
"""

import io
import json
import os
import pickle
import re
from pathlib import Path

import numpy as np
import pytest
import timm
import timm.models.vision_transformer as timm_vit
import torch
from PIL import Image
from safetensors.torch import save_file
from timm.layers import resample_abs_pos_embed
from transformers import ViTConfig as HFConfig
from transformers import ViTForImageClassification, ViTModel

import vitkit
from reference_models import official_resnet_constants, randomise
from vitkit.catalog import load_pretrained, load_weights
from vitkit.errors import CheckpointError, ConfigError, WeightsNotFoundError
from vitkit.model.posembed import resample_grid_embed
from vitkit.preprocess import Preprocess
from vitkit.weights import save_npz, save_pretrained
from vitkit.weights.formats import hub
from vitkit.weights.formats.hub import local_filename, named_checkpoints, resolve_named

TOL = 1e-5


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a - b).abs().max().item()


# -- position-embedding resampling ---------------------------------------------------------------
@pytest.mark.parametrize("old,new", [((7, 7), (12, 12)), ((7, 7), (4, 9)), ((6, 10), (9, 5)),
                                     ((14, 14), (24, 24))])
@pytest.mark.parametrize("mode", ["bilinear", "bicubic"])
@pytest.mark.parametrize("prefix", [0, 1])
@pytest.mark.parametrize("antialias", [False, True])
def test_resampling_matches_timm(old, new, mode, prefix, antialias):
    pos = torch.randn(1, prefix + old[0] * old[1], 32)
    ours = resample_grid_embed(pos, old, new, prefix, mode, antialias=antialias)
    theirs = resample_abs_pos_embed(pos, list(new), list(old), num_prefix_tokens=prefix,
                                    interpolation=mode, antialias=antialias)
    assert ours.shape == (1, prefix + new[0] * new[1], 32)
    assert _max_diff(ours, theirs) <= 1e-6
    if prefix:
        assert torch.equal(ours[:, :1], pos[:, :1])  # the class token's embedding is kept


def test_resampling_aligned_corners_keeps_the_corner_embeddings():
    pos = torch.randn(1, 1 + 16, 8)
    out = resample_grid_embed(pos, (4, 4), (7, 7), 1, "bilinear", align_corners=True)
    grid_in, grid_out = pos[0, 1:].view(4, 4, 8), out[0, 1:].view(7, 7, 8)
    for (i, j), (k, m) in (((0, 0), (0, 0)), ((3, 3), (6, 6)), ((0, 3), (0, 6))):
        assert torch.allclose(grid_in[i, j], grid_out[k, m], atol=1e-6)


def test_load_at_new_resolution_equals_timm_resampled_load(tmp_path):
    model = randomise(vitkit.create_model("Ti/16", img_size=64, depth=2, num_classes=5,
                                           act="gelu_tanh"))
    path = save_npz(model, tmp_path / "ti.npz")
    ours = load_pretrained(path, img_size=(96, 128), pos_interpolation="bilinear")
    reference = timm_vit.VisionTransformer(img_size=(96, 128), patch_size=16, embed_dim=192,
                                           depth=2, num_heads=3, num_classes=5,
                                           act_layer="gelu_tanh").eval()
    timm_vit._load_weights(reference, str(path))  # timm's .npz reader: bilinear, half-pixel
    images = torch.randn(2, 3, 96, 128)
    with torch.no_grad():
        assert _max_diff(ours(images), reference(images)) <= TOL
    assert ours.preprocess.img_size == (96, 128)


# -- timm and Hugging Face files ---------------------------------------------------------------
@pytest.mark.parametrize("suffix", [".safetensors", ".pth", ".bin"])
def test_timm_state_dict_files(tmp_path, suffix):
    reference = randomise(timm_vit.VisionTransformer(img_size=32, patch_size=8, embed_dim=64,
                                                      depth=2, num_heads=4, num_classes=6))
    path = tmp_path / f"model{suffix}"
    if suffix == ".safetensors":
        save_file(reference.state_dict(), path)
    else:
        torch.save({"state_dict": reference.state_dict()}, path)
    model = load_pretrained(path, num_heads=4)
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        assert _max_diff(model(images), reference(images)) <= TOL
    assert model.origin == "timm"


@pytest.mark.parametrize("timm_name, layers, patch", [("vit_base_r50_s16_224", (3, 4, 9), 16),
                                                      ("vit_tiny_r_s16_p8_224", (), 32)])
def test_timm_hybrid_state_dict(tmp_path, timm_name, layers, patch):
    reference = randomise(timm.create_model(timm_name, img_size=64, embed_dim=192,
                                             depth=1, num_heads=3, num_classes=4))
    save_file(reference.state_dict(), tmp_path / "hybrid.safetensors")
    model = load_pretrained(tmp_path / "hybrid.safetensors")
    assert model.config.stem == "resnet" and model.config.resnet_layers == layers
    assert model.config.patch_size == patch and model.config.img_size == (64, 64)
    assert model.config.resnet_norm == "timm"  # timm's constants, which its file is computed with
    images = torch.randn(2, 3, 64, 64)
    with torch.no_grad():  # before: the official constants, 2e-3 to 1e-2 from timm's R50 logits
        assert _max_diff(model(images), reference(images)) <= TOL
        official = load_pretrained(tmp_path / "hybrid.safetensors", resnet_norm="official")
        official_resnet_constants(reference)  # the official code's, on both sides
        assert _max_diff(official(images), reference(images)) <= TOL


def _hf_config(**kwargs) -> HFConfig:
    settings = dict(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                    num_attention_heads=4, intermediate_size=128, num_labels=5,
                    id2label={i: f"thing{i}" for i in range(5)},
                    label2id={f"thing{i}": i for i in range(5)})
    return HFConfig(**{**settings, **kwargs})


def test_hf_save_pretrained_folder(tmp_path):
    reference = randomise(ViTForImageClassification(_hf_config()))
    reference.save_pretrained(tmp_path / "hf")
    model = load_pretrained(tmp_path / "hf")
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert _max_diff(model(images), reference(images).logits) <= TOL
    assert model.class_names == [f"thing{i}" for i in range(5)]
    assert model.origin == "huggingface"


@pytest.mark.parametrize(("size", "crop"), [(39, 32), ({"height": 36, "width": 36},
                                                      {"height": 32, "width": 32}),
                                            ({"shortest_edge": 40}, {"height": 32, "width": 32})])
def test_hf_processor_that_resizes_then_centre_crops_gives_its_pixels(tmp_path, size, crop):
    """A Hugging Face "vit" folder whose processor resizes and then centre-crops (DeiT's:
    256, then 224) gives the pixels of transformers' PIL processor (transformers 5's default
    processors resize through torchvision)."""
    pil = pytest.importorskip("transformers.models.deit.image_processing_pil_deit")
    reference = randomise(ViTForImageClassification(_hf_config()))
    reference.save_pretrained(tmp_path)
    settings = {"do_resize": True, "size": size, "do_center_crop": True, "crop_size": crop,
                "resample": 3, "image_mean": [0.485, 0.456, 0.406],
                "image_std": [0.229, 0.224, 0.225]}
    (tmp_path / "preprocessor_config.json").write_text(json.dumps(settings))
    model = load_pretrained(tmp_path)
    processor = pil.DeiTImageProcessorPil(**settings)
    yy, xx = np.mgrid[0:120, 0:160]
    for image in (np.stack([xx * 255 // 160, yy * 255 // 120, (xx + yy) * 255 // 280], -1),
                  np.random.default_rng(0).integers(0, 256, (61, 47, 3))):
        picture = Image.fromarray(image.astype(np.uint8))
        theirs = processor(images=picture, return_tensors="pt")["pixel_values"]
        assert _max_diff(model.preprocess([picture]), theirs) <= 1e-5


def test_the_default_crop_offset_is_left_out_of_saved_files(tmp_path):
    """Saved files leave out the default crop offset, so readers without crop_offset (which
    refuse unknown preprocess keys) read them; a Hugging Face folder's "floor" is kept."""
    folder = save_pretrained(vitkit.create_model("Ti/16", img_size=32, depth=1), tmp_path / "a")
    saved = json.loads((folder / "config.json").read_text())
    assert "crop_offset" not in json.dumps(saved)
    floor = Preprocess(img_size=32, resize_mode="squash", crop_pct=0.875, crop_offset="floor")
    assert Preprocess.from_dict(floor.to_dict()) == floor
    assert Preprocess.from_dict(Preprocess(img_size=32).to_dict()).crop_offset == "round"


def test_hf_vit_model_pooler_is_pre_logits(tmp_path):
    reference = randomise(ViTModel(_hf_config(hidden_act="gelu_pytorch_tanh")))
    reference.save_pretrained(tmp_path / "hf")
    model = load_pretrained(tmp_path / "hf")
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert _max_diff(model(images), reference(images).pooler_output) <= TOL


# -- vitkit's own format and training checkpoints ------------------------------------------------
def test_vitkit_format_round_trip(tmp_path):
    model = randomise(vitkit.create_model("S/16", img_size=(32, 48), depth=2, num_classes=3,
                                           pos_embed="sincos2d", class_token=False,
                                           pool="mean_patches"))
    preprocess = Preprocess(img_size=(32, 48), resize_mode="shorter_side", crop_pct=0.875,
                            interpolation="bicubic", mean=(0.4, 0.5, 0.6), std=(0.2, 0.3, 0.4))
    folder = save_pretrained(model, tmp_path / "mine", preprocess, ["a", "b", "c"])
    assert {p.name for p in folder.iterdir()} == {"model.safetensors", "config.json"}
    loaded = load_pretrained(folder)
    images = torch.randn(2, 3, 32, 48)
    with torch.no_grad():
        assert torch.equal(loaded(images), model(images))
    assert loaded.config == model.config
    assert loaded.preprocess == preprocess and loaded.class_names == ["a", "b", "c"]
    # the weights file alone is found through the config beside it
    assert load_pretrained(folder / "model.safetensors").class_names == ["a", "b", "c"]


def test_save_pretrained_and_from_pretrained_methods_round_trip(tmp_path):
    """Hugging Face's habits: `model.save_pretrained(dir)` then
    `VisionTransformer.from_pretrained(dir)` give the same outputs, keyword arguments go to
    `load_pretrained`."""
    model = randomise(vitkit.create_model("Ti/16", img_size=32, depth=2, num_classes=3))
    folder = model.save_pretrained(tmp_path / "mine", class_names=["a", "b", "c"])
    assert folder == tmp_path / "mine"
    loaded = vitkit.VisionTransformer.from_pretrained(folder)
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        assert torch.equal(loaded(images), model(images))
    assert loaded.class_names == ["a", "b", "c"] and not loaded.training
    bigger = vitkit.VisionTransformer.from_pretrained(folder, img_size=64, num_classes=5)
    assert bigger.config.img_size == (64, 64) and bigger.config.num_classes == 5
    assert bigger.pos_embed.shape == (1, 1 + 16, 192)


def test_from_pretrained_takes_a_checkpoint_name_with_its_options(tmp_path, monkeypatch):
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    model = randomise(vitkit.create_model("Ti/16", img_size=32, depth=1, act="gelu_tanh"))
    save_npz(model, tmp_path / local_filename("B/16-i21k"))
    loaded = vitkit.VisionTransformer.from_pretrained("B/16-i21k", weights_dir=tmp_path,
                                                      download=False)
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert _max_diff(loaded(images), model(images)) <= TOL


def test_official_preprocessing_is_half_half(tmp_path):
    path = save_npz(vitkit.create_model("Ti/16", img_size=32, depth=1), tmp_path / "o.npz")
    pre = load_pretrained(path).preprocess
    assert (pre.mean, pre.std, pre.resize_mode, pre.interpolation) == \
        ((0.5,) * 3, (0.5,) * 3, "squash", "bilinear")


def test_new_head_is_zero_and_pre_logits_dropped(tmp_path):
    model = randomise(vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=9,
                                           pre_logits_dim=192))
    path = save_npz(model, tmp_path / "i21k.npz")
    tuned = load_pretrained(path, num_classes=4, img_size=64)
    assert tuned.config.pre_logits_dim == 0 and tuned.config.num_classes == 4
    assert not tuned.head.weight.any() and not tuned.head.bias.any()
    assert tuned.pos_embed.shape == (1, 1 + 16, 192)


def test_training_checkpoint_loads(tmp_path):
    from vitkit.train.config import load_train_config
    from vitkit.train.loop import train

    cfg = load_train_config("digits", ["epochs=1", "warmup_epochs=0.5", "progress=false",
                                       f"out_dir={tmp_path}",
                                       "train_limit=256", "test_limit=128"])
    train(cfg)
    model = load_pretrained(tmp_path / "last.pt")
    assert model.origin == "vitkit-train"
    assert model.class_names == [str(i) for i in range(10)]
    assert model.preprocess.img_size == model.config.img_size


# -- named checkpoints, offline ------------------------------------------------------------------
def test_named_checkpoint_from_weights_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    model = randomise(vitkit.create_model("Ti/16", img_size=32, depth=1, act="gelu_tanh"))
    save_npz(model, tmp_path / local_filename("B/16-i21k"))
    assert resolve_named("ViT-B_16-i21k", tmp_path, download=False) == \
        tmp_path / "imagenet21k_ViT-B_16.npz"
    loaded = load_pretrained("B/16-i21k", weights_dir=tmp_path, download=False)
    images = torch.randn(1, 3, 32, 32)
    with torch.no_grad():
        assert _max_diff(loaded(images), model(images)) <= TOL


def test_named_checkpoint_missing_offline_says_where(tmp_path, monkeypatch):
    monkeypatch.setenv("VITKIT_CACHE", str(tmp_path / "cache"))
    with pytest.raises(WeightsNotFoundError, match=r"storage\.googleapis\.com.*ViT-L_16"):
        load_pretrained("L/16-i21k-i1k-384", download=False)
    with pytest.raises(WeightsNotFoundError, match="Did you mean"):
        load_pretrained("B/16-i21", download=False)
    assert named_checkpoints()["R50+B/16-i21k"].endswith("imagenet21k/R50%2BViT-B_16.npz")


def _release_file(path: Path, classes: int) -> Path:
    """A stand-in for a 2020 release .npz: only its head/bias, what tells i21k (21,843
    classes) from its ImageNet-2012 fine-tune (1000) when both are named "ViT-B_16.npz"."""
    np.savez(path, **{"head/bias": np.zeros(classes, np.float32)})
    return path


_SHARED_FILE_NAMES = [("B/16-i21k", "B/16-i21k-i1k-384"), ("B/32-i21k", "B/32-i21k-i1k-384"),
                      ("L/16-i21k", "L/16-i21k-i1k-384"), ("L/32-i21k", "L/32-i21k-i1k-384"),
                      ("R50+B/16-i21k", "R50+B/16-i21k-i1k-384")]


def test_shared_release_file_name_is_used_only_for_its_checkpoint(tmp_path):
    by_basename = {}  # the release's file names that two checkpoints share: all listed above
    for name, path in hub._OFFICIAL.items():
        by_basename.setdefault(path.rsplit("/", 1)[1], []).append(name)
    assert sorted(tuple(names) for names in by_basename.values() if len(names) > 1) == \
        sorted(_SHARED_FILE_NAMES)
    i21k = _release_file(tmp_path / "ViT-B_16.npz", 21843)  # imagenet21k/ViT-B_16.npz
    assert resolve_named("B/16-i21k", tmp_path, download=False) == i21k
    with pytest.raises(WeightsNotFoundError) as caught:
        resolve_named("B/16-i21k-i1k-384", tmp_path, download=False)
    message = str(caught.value)
    assert f"{i21k} is imagenet21k/ViT-B_16.npz (a 21843-class head), not " \
        "B/16-i21k-i1k-384's imagenet21k+imagenet2012/ViT-B_16.npz" in message
    assert "storage.googleapis.com/vit_models/imagenet21k%2Bimagenet2012/ViT-B_16.npz" in message
    # Following the advice: the fine-tune saved under the name the message gives.
    advised = Path(re.search(r"save it as (\S+)\.$", message)[1])
    assert advised == tmp_path / "imagenet21k+imagenet2012_ViT-B_16.npz"
    _release_file(advised, 1000)
    assert resolve_named("B/16-i21k-i1k-384", tmp_path, download=False) == advised
    assert resolve_named("B/16-i21k", tmp_path, download=False) == i21k
    # A file by the shared name that is no readable .npz is left to its reader to describe.
    advised.unlink()
    i21k.write_text("<!DOCTYPE html><html><body>Sign in to continue</body></html>")
    assert resolve_named("B/16-i21k-i1k-384", tmp_path, download=False) == i21k
    with pytest.raises(vitkit.VitkitError, match="HTML page"):
        load_pretrained("B/16-i21k-i1k-384", weights_dir=tmp_path, download=False)


@pytest.mark.parametrize("pair", _SHARED_FILE_NAMES)
@pytest.mark.parametrize("have_i21k", [True, False])
def test_other_checkpoint_by_the_shared_file_name_is_not_loaded(tmp_path, pair, have_i21k):
    have, want = pair if have_i21k else pair[::-1]
    classes = 21843 if have_i21k else 1000
    found = _release_file(tmp_path / hub._OFFICIAL[have].rsplit("/", 1)[1], classes)
    assert resolve_named(have, tmp_path, download=False) == found
    with pytest.raises(WeightsNotFoundError) as refused:
        resolve_named(want, tmp_path, download=False)
    says(refused.value, str(found), hub._OFFICIAL[have], f"{classes}-class head", want,
         hub._OFFICIAL[want])


def test_missing_named_checkpoint_says_where_in_the_given_weights_dir(tmp_path, monkeypatch):
    wanted = tmp_path / "imagenet21k_ViT-B_16.npz"
    with pytest.raises(WeightsNotFoundError) as caught:
        resolve_named("B/16-i21k", tmp_path, download=False)
    assert str(caught.value).endswith(f"put it at {wanted}.")
    assert "--weights-dir" not in str(caught.value)
    with pytest.raises(WeightsNotFoundError, match="pass --weights-dir"):
        resolve_named("B/16-i21k", download=False)  # none given: one may be

    def unreachable(*args, **kwargs):
        raise OSError("Network is unreachable")

    monkeypatch.setattr(hub, "write_atomic", unreachable)  # a failed download, no network
    with pytest.raises(WeightsNotFoundError, match="unreachable") as caught:
        resolve_named("B/16-i21k", tmp_path, download=True)
    assert str(caught.value).endswith(f"put it at {wanted}.")
    assert "--weights-dir" not in str(caught.value)
    _release_file(tmp_path / "ViT-B_16.npz", 1000)
    with pytest.raises(WeightsNotFoundError) as refused:
        resolve_named("B/16-i21k", tmp_path, download=True)
    says(refused.value, f"put it at {wanted}", "not used", str(tmp_path / "ViT-B_16.npz"),
         "imagenet21k+imagenet2012/ViT-B_16.npz", "1000-class head")


# -- bad files ------------------------------------------------------------------------------------
def test_truncated_npz(tmp_path):
    path = save_npz(vitkit.create_model("Ti/16", img_size=32, depth=1), tmp_path / "t.npz")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(vitkit.VitkitError, match="truncated"):
        load_pretrained(path)


def test_html_saved_as_npz(tmp_path):
    path = tmp_path / "ViT-B_16.npz"
    path.write_text("<!DOCTYPE html><html><body>Sign in to continue</body></html>")
    with pytest.raises(vitkit.VitkitError, match="HTML page"):
        load_pretrained(path)


def test_shapes_that_fit_no_variant(tmp_path):
    model = vitkit.create_model("Ti/16", img_size=32, depth=2)
    state = dict(model.state_dict())
    state["blocks.1.mlp.fc1.weight"] = torch.zeros(100, 192)  # layers disagree
    save_file(state, tmp_path / "odd.safetensors")
    with pytest.raises(vitkit.VitkitError, match=r"(?s)do not fit.*blocks\.1\.mlp\.fc1"):
        load_pretrained(tmp_path / "odd.safetensors")
    save_file({"encoder.weight": torch.zeros(3, 3)}, tmp_path / "other.safetensors")
    with pytest.raises(vitkit.VitkitError, match="not a ViT state dict"):
        load_pretrained(tmp_path / "other.safetensors")


def test_head_size_mismatch_names_num_classes(tmp_path):
    source = vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=10)
    folder = save_pretrained(source, tmp_path / "ten")
    target = vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=5)
    with pytest.raises(vitkit.VitkitError, match="num_classes="):
        load_weights(target, folder)
    assert load_pretrained(folder, num_classes=5).head.out_features == 5


def test_a_position_grid_mismatch_names_the_resampling_load(tmp_path):
    """load_weights of 64 px weights into a 96 px model is refused naming the position grid
    and the resampling load (load_pretrained with img_size), which, followed, loads."""
    folder = save_pretrained(vitkit.create_model("Ti/16", img_size=64, depth=1), tmp_path / "f")
    target = vitkit.create_model("Ti/16", img_size=96, depth=1)
    with pytest.raises(vitkit.VitkitError) as refused:
        load_weights(target, folder)
    says(refused.value, "position grid", "load_pretrained(path, img_size=...)")
    assert load_pretrained(folder, img_size=96).pos_embed.shape == target.pos_embed.shape


def test_save_pretrained_unwraps_compiled_and_ddp_models_and_refuses_meta(tmp_path):
    """save_pretrained of a torch.compile'd or DDP-wrapped model saves the inner model, with
    plain keys that load_pretrained reads (as it reads a compiled model's state dict); a
    meta-device model is refused by name.
"""
    model = randomise(vitkit.create_model("Ti/16", img_size=32, depth=1, num_classes=3))
    images = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        expected = model.eval()(images)
    compiled = torch.compile(model)  # wrapped only: nothing compiles until it is called
    folder = save_pretrained(compiled, tmp_path / "compiled")
    with torch.no_grad():
        assert torch.equal(load_pretrained(folder)(images), expected)

    class Wrapper(torch.nn.Module):  # DDP's and DataParallel's layout: `.module`
        def __init__(self, module):
            super().__init__()
            self.module = module

    folder = save_pretrained(Wrapper(model), tmp_path / "ddp")
    with torch.no_grad():
        assert torch.equal(load_pretrained(folder)(images), expected)
    torch.save(compiled.state_dict(), tmp_path / "compiled.pth")
    assert next(iter(compiled.state_dict())).startswith("_orig_mod.")
    with torch.no_grad():
        loaded = load_pretrained(tmp_path / "compiled.pth", num_classes=3, img_size=32)
        assert (loaded(images) - expected).abs().max() < 1e-5
    with pytest.raises(vitkit.VitkitError, match="meta device, so it holds no weights"):
        save_pretrained(vitkit.create_model("Ti/16", depth=1, device="meta"), tmp_path / "m")
    with pytest.raises(vitkit.VitkitError, match="takes a vitkit VisionTransformer"):
        save_pretrained(torch.nn.Linear(2, 2), tmp_path / "linear")


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo pwned > /dev/null",))


def test_pickle_that_runs_code_is_refused(tmp_path):
    path = tmp_path / "evil.pth"
    buffer = io.BytesIO()
    torch.save({"patch_embed.proj.weight": torch.zeros(1), "payload": _RunsCode()}, buffer)
    path.write_bytes(buffer.getvalue())
    with pytest.raises(vitkit.VitkitError, match="refused"):
        load_pretrained(path)
    raw = tmp_path / "evil.bin"
    raw.write_bytes(pickle.dumps(_RunsCode(), protocol=2))
    with pytest.raises(vitkit.VitkitError, match="refused"):
        load_pretrained(raw)


def test_not_a_checkpoint(tmp_path):
    path = tmp_path / "notes.pt"
    path.write_text("just some text")
    with pytest.raises(vitkit.VitkitError, match="not a checkpoint format"):
        load_pretrained(path)
    (tmp_path / "folder").mkdir()
    with pytest.raises(vitkit.VitkitError, match=r"config\.json"):
        load_pretrained(tmp_path / "folder")
    (tmp_path / "folder" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    with pytest.raises(vitkit.VitkitError):
        load_pretrained(tmp_path / "folder")


TINY = {"img_size": 16, "patch_size": 8, "width": 16, "depth": 1, "num_heads": 2, "mlp_dim": 32}


def test_load_weights_advice_on_another_head_size_is_followed(tmp_path):
    source = vitkit.create_model({**TINY, "num_classes": 4})
    folder = vitkit.save_pretrained(source, tmp_path / "four")
    target = vitkit.create_model({**TINY, "num_classes": 7})
    with pytest.raises(CheckpointError) as refused:
        load_weights(target, folder)
    says(refused.value, "checkpoint 4 outputs", "model 7", "load_pretrained(path, num_classes=7)")
    followed = vitkit.load_pretrained(folder, num_classes=7)
    assert followed.config.num_classes == 7
    assert torch.equal(followed.blocks[0].mlp.fc1.weight, source.blocks[0].mlp.fc1.weight)


def test_save_pretrained_onto_a_file_is_refused(tmp_path):
    target = tmp_path / "model.safetensors"
    target.write_bytes(b"not a folder")
    with pytest.raises(ConfigError) as refused:
        vitkit.save_pretrained(vitkit.create_model(TINY), target)
    says(refused.value, str(target), "is a file", "folder")
    assert target.read_bytes() == b"not a folder"
    assert vitkit.save_pretrained(vitkit.create_model(TINY), tmp_path / "model").is_dir()


def test_class_names_that_do_not_name_every_output_are_refused(tmp_path):
    model = vitkit.create_model({**TINY, "num_classes": 3})
    with pytest.raises(ConfigError) as refused:
        vitkit.save_pretrained(model, tmp_path / "m", class_names=["cat", "dog", "eel", "fox"])
    says(refused.value, "4 class names", "3 outputs", "one name per output")
    assert not (tmp_path / "m").exists()
    spare = vitkit.save_pretrained(model, tmp_path / "spare", class_names=["cat", "dog"])
    assert vitkit.load_pretrained(spare).class_names == ["cat", "dog"]  # a spare output: unnamed
    folder = vitkit.save_pretrained(model, tmp_path / "m", class_names=["cat", "dog", "eel"])
    assert vitkit.load_pretrained(folder).class_names == ["cat", "dog", "eel"]  # advice followed
    loaded = vitkit.load_pretrained(folder)
    loaded.reset_classifier(2)  # a new head: the old names no longer describe it
    assert loaded.class_names is None
    assert vitkit.load_pretrained(vitkit.save_pretrained(loaded, tmp_path / "two")
                                  ).config.num_classes == 2
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "class_names": list("abcd")}))
    with pytest.raises(CheckpointError) as refused:
        vitkit.load_pretrained(folder)
    says(refused.value, "4 class names", "3 outputs")


def says(text, *parts):
    """Assert that the message names each part (case-insensitive), showing it otherwise."""
    text = str(text)
    missing = [part for part in parts if part.lower() not in text.lower()]
    assert not missing, f"message lacks {missing}: {text}"
