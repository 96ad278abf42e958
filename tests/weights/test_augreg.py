"""The AugReg checkpoints ("How to train your ViT?", gs://vit_models/augreg) by name.

References: timm's own pretrained configs (the `augreg_in21k` and `augreg_in21k_ft_in1k`
tags' URLs, and timm's models of the same names for parameter counts) and timm's reader of
official .npz files (`_load_weights`) for the logits (1e-5 at fp32). AugReg files use the
original vit_jax key layout without a pre-logits layer (vit_jax/configs/models.py:
representation_size=None), which the npz adapter already reads (tests/weights/test_npz.py); here a
file of that layout is found by its release name and loaded by the checkpoint's name.
"""

from pathlib import Path

import pytest
import timm
import timm.models.vision_transformer as timm_vit
import torch

import vitkit
from reference_models import randomise
from vitkit.catalog import config_of, count_parameters, load_pretrained, lookup
from vitkit.cli import main
from vitkit.errors import WeightsNotFoundError
from vitkit.weights import save_npz
from vitkit.weights.formats.hub import checkpoint_table, named_checkpoints

TOL = 1e-5


def timm_augreg_urls() -> dict[str, str]:
    """timm model tag -> release URL for every AugReg ImageNet-21k file timm knows."""
    urls = {}
    for name in timm.list_pretrained("*augreg_in21k*"):
        url = timm.models.get_pretrained_cfg(name).url or ""
        if "/vit_models/augreg/" in url:
            urls[name] = url
    return urls


def test_every_augreg_file_timm_knows_has_a_name():
    ours = set(named_checkpoints().values())
    urls = timm_augreg_urls()
    assert len(urls) >= 20
    assert set(urls.values()) <= ours


def test_models_checkpoints_lists_every_augreg_name_and_url(capsys):
    assert main(["models", "--checkpoints"]) in (0, None)
    out = capsys.readouterr().out
    for row in checkpoint_table():
        assert row.name in out and row.url in out
    for url in timm_augreg_urls().values():
        assert url in out
    rows = {line.split()[0]: line for line in out.splitlines() if "-augreg-" in line}
    assert "85.49" in rows["B/16-augreg-i21k-i1k-384"]  # the official README's table
    assert "86.00" in rows["B/16-augreg-i21k-i1k-384-timm"]  # timm's results-imagenet.csv: 85.996


def test_plain_models_keeps_the_variants_and_points_to_the_table(capsys):
    assert main(["models"]) in (0, None)
    out = capsys.readouterr().out
    assert "86,567,656" in out and "B/16-i21k-i1k-384" in out
    assert "vitkit models --checkpoints" in out


@pytest.mark.parametrize("name, timm_name, classes", [
    ("Ti/16-augreg-i21k", "vit_tiny_patch16_224", 21843),
    ("Ti/16-augreg-i21k-i1k-384", "vit_tiny_patch16_384", 1000),
    ("S/32-augreg-i21k", "vit_small_patch32_224", 21843),
    ("R+Ti/16-augreg-i21k-i1k-224", "vit_tiny_r_s16_p8_224", 1000),
    ("R26+S/32-augreg-i21k-i1k-384", "vit_small_r26_s32_384", 1000),
])
def test_name_describes_the_model_timm_builds_for_it(name, timm_name, classes):
    config = config_of(name)
    reference = timm.create_model(timm_name, pretrained=False, num_classes=classes)
    assert config.pre_logits_dim == 0 and config.num_classes == classes
    assert config.img_size == tuple(reference.patch_embed.img_size)
    assert count_parameters(config) == sum(p.numel() for p in reference.parameters())


@pytest.mark.parametrize("name", ["Ti/16-augreg-i21k", "Ti/16-augreg-i21k-i1k-224"])
def test_a_release_file_in_weights_dir_loads_by_name(tmp_path, name):
    config = config_of(name)
    model = randomise(vitkit.VisionTransformer(config))
    basename = named_checkpoints()[name].rsplit("/", 1)[1]
    path = save_npz(model, tmp_path / basename)  # the original layout, no pre_logits
    ours = load_pretrained(name, weights_dir=tmp_path, download=False)
    assert ours.config.num_classes == config.num_classes and ours.config.pre_logits_dim == 0
    reference = timm_vit.VisionTransformer(
        img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3,
        num_classes=config.num_classes, act_layer="gelu_tanh").eval()
    timm_vit._load_weights(reference, str(path))
    images = torch.randn(2, 3, 224, 224)
    with torch.no_grad():
        assert (ours(images) - reference(images)).abs().max().item() <= TOL


# -- the official picks: google-research/vision_transformer, README.md, "We recommend using the
# following checkpoints, trained with [AugReg] that have the best pre-training metrics" -----------
# variant: (Pre-trained checkpoint, Fine-tuned checkpoint, Imagenet accuracy), as the README's
# table writes them (without gs://vit_models/augreg/ and .npz).
README_PICKS = {
    "L/16": ("L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0",
             "L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0"
             "--imagenet2012-steps_20k-lr_0.01-res_384", 85.59),
    "B/16": ("B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
             "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0"
             "--imagenet2012-steps_20k-lr_0.03-res_384", 85.49),
    "S/16": ("S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
             "S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0"
             "--imagenet2012-steps_20k-lr_0.03-res_384", 83.73),
    "R50+L/32": ("R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1",
                 "R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1"
                 "--imagenet2012-steps_20k-lr_0.01-res_384", 85.99),
    "R26+S/32": ("R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
                 "R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0"
                 "--imagenet2012-steps_20k-lr_0.01-res_384", 83.85),
    "Ti/16": ("Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
              "Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0"
              "--imagenet2012-steps_20k-lr_0.03-res_384", 78.22),
    "B/32": ("B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0",
             "B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0"
             "--imagenet2012-steps_20k-lr_0.01-res_384", 83.59),
    "S/32": ("S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0",
             "S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0"
             "--imagenet2012-steps_20k-lr_0.01-res_384", 79.58),
    "R+Ti/16": ("R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
                "R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0"
                "--imagenet2012-steps_20k-lr_0.03-res_384", 75.40),
}
# vitkit's AugReg variant -> timm's model name (without _224/_384).
TIMM_MODELS = {"Ti/16": "vit_tiny_patch16", "S/32": "vit_small_patch32",
               "S/16": "vit_small_patch16", "B/32": "vit_base_patch32",
               "B/16": "vit_base_patch16", "B/8": "vit_base_patch8", "L/16": "vit_large_patch16",
               "R+Ti/16": "vit_tiny_r_s16_p8", "R26+S/32": "vit_small_r26_s32",
               "R50+L/32": "vit_large_r50_s32"}
# Where timm picks another file than the README, timm's keeps a name that says so.
TIMM_NAMES = {"S/32-augreg-i21k-timm", "S/32-augreg-i21k-i1k-384-timm",
              "B/32-augreg-i21k-timm", "B/32-augreg-i21k-i1k-384-timm",
              "B/16-augreg-i21k-i1k-384-timm",
              "L/16-augreg-i21k-timm", "L/16-augreg-i21k-i1k-384-timm",
              "R26+S/32-augreg-i21k-timm", "R26+S/32-augreg-i21k-i1k-384-timm",
              "R50+L/32-augreg-i21k-timm", "R50+L/32-augreg-i21k-i1k-384-timm"}
AUGREG = "https://storage.googleapis.com/vit_models/augreg/"


def stem_of(name: str) -> str:
    """The release file stem a checkpoint name downloads."""
    url = named_checkpoints()[name]
    assert url.startswith(AUGREG) and url.endswith(".npz")
    return url.removeprefix(AUGREG).removesuffix(".npz")


def timm_url(variant: str, tag: str) -> str | None:
    """timm's pick for `tag` ("i21k", "i21k-i1k-224", "i21k-i1k-384"), None where timm has none."""
    size = 224 if tag == "i21k" else int(tag.rsplit("-", 1)[1])
    timm_tag = "augreg_in21k" if tag == "i21k" else "augreg_in21k_ft_in1k"
    name = f"{TIMM_MODELS[variant]}_{size}.{timm_tag}"
    return timm.models.get_pretrained_cfg(name).url if name in timm.list_pretrained() else None


@pytest.mark.parametrize("variant", README_PICKS)
def test_the_plain_names_are_the_official_readme_picks_with_its_top1(variant):
    pretrained, finetuned, top1 = README_PICKS[variant]
    assert stem_of(f"{variant}-augreg-i21k") == pretrained
    assert stem_of(f"{variant}-augreg-i21k-i1k-384") == finetuned
    table = {row.name: row for row in checkpoint_table()}
    row = table[f"{variant}-augreg-i21k-i1k-384"]
    assert (row.top1, row.top1_source) == (top1, "vit README")


@pytest.mark.parametrize("variant", TIMM_MODELS)
def test_timms_picks_keep_names_that_say_so(variant):
    names = named_checkpoints()
    for tag in ("i21k", "i21k-i1k-224", "i21k-i1k-384"):
        url = timm_url(variant, tag)
        plain = f"{variant}-augreg-{tag}"
        if url is None:
            assert plain not in names
            continue
        timm_name = plain + "-timm" if plain + "-timm" in names else plain
        assert names[timm_name] == url
        if timm_name != plain:  # a "-timm" name only where the README picks another file
            assert names[plain] != url
    assert {name for name in names if name.endswith("-timm")} == TIMM_NAMES


def test_every_augreg_file_has_one_name():
    urls = list(named_checkpoints().values())
    assert len(urls) == len(set(urls))


@pytest.mark.parametrize("name", [n for n in named_checkpoints() if "-augreg-" in n])
def test_the_release_file_stem_names_the_checkpoint(name):
    stem = stem_of(name)
    for spelling in (stem, f"{stem}.npz", f"augreg/{stem}.npz", f"gs://vit_models/augreg/{stem}.npz",
                     named_checkpoints()[name]):
        named = lookup(spelling)
        assert (named.kind, named.key) == ("checkpoint", name), spelling


@pytest.mark.parametrize("name", ["B/32-augreg-i21k-timm", "R26+S/32-augreg-i21k-i1k-384-timm",
                                  "B/16-augreg-i21k-i1k-384-timm"])
def test_a_timm_name_and_its_stem_build_the_model_of_the_plain_name(capsys, name):
    plain = name.removesuffix("-timm")
    assert config_of(name) == config_of(plain) == config_of(stem_of(name))
    assert main(["summary", stem_of(name)]) in (0, None)
    out = capsys.readouterr().out
    total = next(line for line in out.splitlines() if line.startswith("Total params:"))
    assert int(total.split()[2].replace(",", "")) == count_parameters(name)


def test_offline_a_timm_name_asks_for_timms_file_and_finds_it_where_the_message_says(tmp_path):
    name = "S/32-augreg-i21k-timm"
    with pytest.raises(WeightsNotFoundError) as error:
        lookup(name).weights_path(tmp_path, download=False)
    message = str(error.value)  # "Download URL and put it at WEIGHTS_DIR/FILE."
    assert f"Download {timm_url('S/32', 'i21k')} and put it at" in message
    place = Path(message.split(" and put it at ")[1].removesuffix("."))
    assert place.parent == tmp_path
    place.write_bytes(b"")
    assert lookup(name).weights_path(tmp_path, download=False) == place
    assert lookup(stem_of(name)).weights_path(tmp_path, download=False) == place
    release_name = tmp_path / "release" / f"{stem_of(name)}.npz"  # as downloaded from the URL
    release_name.parent.mkdir()
    release_name.write_bytes(b"")
    assert lookup(name).weights_path(release_name.parent, download=False) == release_name


def test_a_release_file_loads_by_its_stem(tmp_path):
    name = "Ti/16-augreg-i21k-i1k-384"
    model = randomise(vitkit.VisionTransformer(config_of(name)))
    save_npz(model, tmp_path / f"{stem_of(name)}.npz")
    ours = load_pretrained(stem_of(name), weights_dir=tmp_path, download=False)
    images = torch.randn(1, 3, 384, 384)
    with torch.no_grad():
        assert torch.equal(ours(images), model.eval()(images))
