"""Named official checkpoints (the 2020 release and the AugReg ones the official README
recommends, with timm's picks beside them): their download URLs, expected ImageNet top-1, the
architecture each name implies, a local cache, and an offline folder.

A source, not a format: `vitkit.catalog` asks it whether a string names a checkpoint and
where its file is; the npz adapter then reads the file. `resolve_named("B/16-i21k")` returns
a local path: the file in `weights_dir` (or $VITKIT_WEIGHTS_DIR) when it is there, else in
the cache (~/.cache/vitkit or $VITKIT_CACHE), downloading it once when downloads are allowed.
"""

from __future__ import annotations

import logging
import os
import re
import struct
import tokenize
import urllib.parse
import urllib.request
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from vitkit.config import ViTConfig, variant_config
from vitkit.errors import WeightsNotFoundError
from vitkit.fieldtypes import did_you_mean
from vitkit.files import cache_root, write_atomic

log = logging.getLogger("vitkit.weights")

BASE_URL = "https://storage.googleapis.com/vit_models"

# name -> path under BASE_URL. "i21k": ImageNet-21k pre-trained, with the pre-logits layer and
# a 21,843-way head; "i21k-i1k-384": fine-tuned on ImageNet-2012 at 384 (at 224 where named).
_OFFICIAL = {
    "B/16-i21k": "imagenet21k/ViT-B_16.npz",
    "B/32-i21k": "imagenet21k/ViT-B_32.npz",
    "L/16-i21k": "imagenet21k/ViT-L_16.npz",
    "L/32-i21k": "imagenet21k/ViT-L_32.npz",
    "H/14-i21k": "imagenet21k/ViT-H_14.npz",
    "R50+B/16-i21k": "imagenet21k/R50+ViT-B_16.npz",
    "R50+L/32-i21k": "imagenet21k/R50+ViT-L_32.npz",
    "R26+B/32-i21k": "imagenet21k/R26+ViT-B_32.npz",
    "B/16-i21k-i1k-384": "imagenet21k+imagenet2012/ViT-B_16.npz",
    "B/16-i21k-i1k-224": "imagenet21k+imagenet2012/ViT-B_16-224.npz",
    "B/32-i21k-i1k-384": "imagenet21k+imagenet2012/ViT-B_32.npz",
    "L/16-i21k-i1k-384": "imagenet21k+imagenet2012/ViT-L_16.npz",
    "L/16-i21k-i1k-224": "imagenet21k+imagenet2012/ViT-L_16-224.npz",
    "L/32-i21k-i1k-384": "imagenet21k+imagenet2012/ViT-L_32.npz",
    "R50+B/16-i21k-i1k-384": "imagenet21k+imagenet2012/R50+ViT-B_16.npz",
}
# The AugReg checkpoints of "How to train your ViT?" (Steiner et al., 2021; gs://vit_models/augreg,
# described by its index.csv): per variant, an ImageNet-21k pre-training ("-augreg-i21k":
# 21,843-way head, no pre-logits layer) and its ImageNet-2012 fine-tunes at 224 and 384
# ("-augreg-i21k-i1k-224/-384": 1000 classes, no pre-logits). Files are named by stem:
# "<pre-training>" and "<pre-training>--imagenet2012-steps_20k-lr_<lr>-res_<px>".
_AUGREG_ROOT = "augreg/"


def _finetuned(start: str, lr: str, res: int) -> str:
    """The stem of the 20k-step ImageNet-2012 fine-tune of pre-training `start`."""
    return f"{start}--imagenet2012-steps_20k-lr_{lr}-res_{res}"


# The defaults: the official picks. google-research/vision_transformer, README.md, section
# "Available ViT models": "We recommend using the following checkpoints, trained with [AugReg]
# that have the best pre-training metrics". Its columns: Model | Pre-trained checkpoint | Size |
# Fine-tuned checkpoint | Resolution | Img/sec | Imagenet accuracy. Every fine-tuned checkpoint
# there is `<pre-trained>--imagenet2012-steps_20k-lr_<lr>-res_384.npz`, so each row is
# variant: (pre-trained stem, fine-tune lr, Imagenet accuracy %), quoted after it as
# "| Model | Size | fine-tune suffix | Resolution | Img/sec | Imagenet accuracy |".
_README_AUGREG: dict[str, tuple[str, str, float]] = {
    "L/16": ("L_16-i21k-300ep-lr_0.001-aug_strong1-wd_0.1-do_0.0-sd_0.0", "0.01", 85.59),
    # | L/16     | 1243 MiB | --imagenet2012-steps_20k-lr_0.01-res_384 | 384 |   50 | 85.59% |
    "B/16": ("B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0", "0.03", 85.49),
    # | B/16     |  391 MiB | --imagenet2012-steps_20k-lr_0.03-res_384 | 384 |  138 | 85.49% |
    "S/16": ("S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0", "0.03", 83.73),
    # | S/16     |  115 MiB | --imagenet2012-steps_20k-lr_0.03-res_384 | 384 |  300 | 83.73% |
    "R50+L/32": ("R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1", "0.01", 85.99),
    # | R50+L/32 | 1337 MiB | --imagenet2012-steps_20k-lr_0.01-res_384 | 384 |  327 | 85.99% |
    "R26+S/32": ("R26_S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", "0.01", 83.85),
    # | R26+S/32 |  170 MiB | --imagenet2012-steps_20k-lr_0.01-res_384 | 384 |  560 | 83.85% |
    "Ti/16": ("Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", "0.03", 78.22),
    # | Ti/16    |   37 MiB | --imagenet2012-steps_20k-lr_0.03-res_384 | 384 |  610 | 78.22% |
    "B/32": ("B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", "0.01", 83.59),
    # | B/32     |  398 MiB | --imagenet2012-steps_20k-lr_0.01-res_384 | 384 |  955 | 83.59% |
    "S/32": ("S_32-i21k-300ep-lr_0.001-aug_none-wd_0.1-do_0.0-sd_0.0", "0.01", 79.58),
    # | S/32     |  118 MiB | --imagenet2012-steps_20k-lr_0.01-res_384 | 384 | 2154 | 79.58% |
    "R+Ti/16": ("R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0", "0.03", 75.40),
    # | R+Ti/16  |   40 MiB | --imagenet2012-steps_20k-lr_0.03-res_384 | 384 | 2426 | 75.40% |
}
# timm's picks: the url of the "augreg_in21k" and "augreg_in21k_ft_in1k" tags in timm's
# default_cfgs (timm 1.0, timm/models/vision_transformer.py, e.g.
# 'vit_large_patch16_224.augreg_in21k', 'vit_large_patch16_384.augreg_in21k_ft_in1k'; the
# hybrids in vision_transformer_hybrid.py, e.g. 'vit_small_r26_s32_384.augreg_in21k_ft_in1k').
# variant: (augreg_in21k stem, {res: (start of the fine-tune, "" = that stem; fine-tune lr)}).
# Where they differ from the README's they keep a name ending in "-timm"; the 224 px fine-tunes
# (the README names none) and B/8 (not in its table) are timm's under the plain names.
_TIMM_AUGREG: dict[str, tuple[str, dict[int, tuple[str, str]]]] = {
    "Ti/16": ("Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
              {224: ("", "0.03"), 384: ("", "0.03")}),
    "S/32": ("S_32-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
             {224: ("", "0.03"), 384: ("", "0.03")}),
    "S/16": ("S_16-i21k-300ep-lr_0.001-aug_light1-wd_0.03-do_0.0-sd_0.0",
             {224: ("", "0.03"), 384: ("", "0.03")}),
    "B/32": ("B_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.03-do_0.0-sd_0.0",
             {224: ("", "0.03"),
              384: ("B_32-i21k-300ep-lr_0.001-aug_light1-wd_0.1-do_0.0-sd_0.0", "0.03")}),
    "B/16": ("B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0",
             {224: ("", "0.01"), 384: ("", "0.01")}),
    "B/8": ("B_8-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0", {224: ("", "0.01")}),
    "L/16": ("L_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1",
             {224: ("", "0.01"), 384: ("", "0.01")}),
    "R+Ti/16": ("R_Ti_16-i21k-300ep-lr_0.001-aug_none-wd_0.03-do_0.0-sd_0.0",
                {224: ("", "0.03"), 384: ("", "0.03")}),
    "R26+S/32": ("R26_S_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.03-do_0.0-sd_0.0",
                 {224: ("R26_S_32-i21k-300ep-lr_0.001-aug_light0-wd_0.03-do_0.1-sd_0.1", "0.03"),
                  384: ("", "0.03")}),
    "R50+L/32": ("R50_L_32-i21k-300ep-lr_0.001-aug_medium2-wd_0.1-do_0.0-sd_0.0",
                 {224: ("R50_L_32-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.1-sd_0.1", "0.01"),
                  384: ("", "0.01")}),
}
TIMM_SUFFIX = "-timm"


def _augreg_stems() -> dict[str, str]:
    """Name -> file stem: the README's picks under the plain names, timm's where they differ
    under the same name + "-timm" (listed right after it)."""
    stems = {}
    for variant, (pretrain, finetunes) in _TIMM_AUGREG.items():
        timm = {"i21k": pretrain} | {f"i21k-i1k-{res}": _finetuned(start or pretrain, lr, res)
                                     for res, (start, lr) in finetunes.items()}
        official = {}
        if variant in _README_AUGREG:
            start, lr, _ = _README_AUGREG[variant]
            official = {"i21k": start, "i21k-i1k-384": _finetuned(start, lr, 384)}
        for tag, timm_stem in timm.items():
            name = f"{variant}-augreg-{tag}"
            stems[name] = official.get(tag, timm_stem)
            if stems[name] != timm_stem:
                stems[name + TIMM_SUFFIX] = timm_stem
    return stems


_AUGREG_STEMS = _augreg_stems()
_OFFICIAL.update({name: f"{_AUGREG_ROOT}{stem}.npz" for name, stem in _AUGREG_STEMS.items()})

# ImageNet-2012 validation top-1 (%) where a source gives one; names not here have none.
# vit README: the vision_transformer README's figures: "They are expected to achieve 81.2% and
# 82.7% top-1" for the -224 fine-tunes of the 2020 release, and the "Imagenet accuracy" column
# of the AugReg table above. timm: results/results-imagenet.csv of
# huggingface/pytorch-image-models (timm's own evaluation of the same files, its crop_pct 0.9
# at 224 and 1.0 at 384).
TOP1 = {
    "B/16-i21k-i1k-224": (81.2, "vit README"),
    "L/16-i21k-i1k-224": (82.7, "vit README"),
    "B/16-i21k-i1k-384": (84.200, "timm"),
    "L/32-i21k-i1k-384": (81.510, "timm"),
    "R50+B/16-i21k-i1k-384": (84.976, "timm"),
    **{f"{variant}-augreg-i21k-i1k-384": (top1, "vit README")
       for variant, (_, _, top1) in _README_AUGREG.items()},
    "Ti/16-augreg-i21k-i1k-224": (75.454, "timm"),
    "S/32-augreg-i21k-i1k-224": (75.994, "timm"),
    "S/32-augreg-i21k-i1k-384-timm": (80.486, "timm"),
    "S/16-augreg-i21k-i1k-224": (81.384, "timm"),
    "B/32-augreg-i21k-i1k-224": (80.716, "timm"),
    "B/32-augreg-i21k-i1k-384-timm": (83.350, "timm"),
    "B/16-augreg-i21k-i1k-224": (84.532, "timm"),
    "B/16-augreg-i21k-i1k-384-timm": (85.996, "timm"),
    "B/8-augreg-i21k-i1k-224": (85.798, "timm"),
    "L/16-augreg-i21k-i1k-224": (85.834, "timm"),
    "L/16-augreg-i21k-i1k-384-timm": (87.084, "timm"),
    "R+Ti/16-augreg-i21k-i1k-224": (71.798, "timm"),
    "R26+S/32-augreg-i21k-i1k-224": (81.864, "timm"),
    "R26+S/32-augreg-i21k-i1k-384-timm": (84.048, "timm"),
    "R50+L/32-augreg-i21k-i1k-224": (84.422, "timm"),
    "R50+L/32-augreg-i21k-i1k-384-timm": (86.182, "timm"),
}
_ALIASES = {"R50+ViT-B/16-i21k": "R50+B/16-i21k"}

# timm's names of the same files, ARCH_RES.TAG ("vit_base_patch16_224.augreg_in21k_ft_in1k"):
# its AugReg picks (the "-timm" file where the README picks another) and the 2020 release.
# timm loads the 2020 release's "orig_in21k" without its head (num_classes=0); vitkit keeps
# the file's. Checked against timm's pretrained configs in tests/weights/test_catalog.py.
_TIMM_SIZE_WORDS = {"Ti": "tiny", "S": "small", "B": "base", "L": "large", "H": "huge"}
_RELEASE_2020_I21K = ("B/16", "B/32", "L/16", "L/32", "H/14", "R50+B/16")
_RELEASE_2020_I1K = (("B/16", 224), ("B/16", 384), ("L/32", 384), ("R50+B/16", 384))
# A timm name with a weights tag: "vit_base_patch16_224.augreg2_in21k_ft_in1k", "timm/...".
TIMM_TAGGED_RE = re.compile(r"^(?:timm/)?(?P<arch>vit_[a-z0-9_]+)\.(?P<tag>[a-z0-9_]+)$")


def _timm_arch(variant: str, res: int) -> str:
    """timm's architecture name of a variant at `res` px: "B/16" -> "vit_base_patch16_224",
    "R50+L/32" -> "vit_large_r50_s32_224", the root-only "R+Ti/16" -> "vit_tiny_r_s16_p8_224"."""
    stem, _, vit = variant.rpartition("+")
    size, patch = vit.split("/")
    base = f"vit_{_TIMM_SIZE_WORDS[size]}"
    if not stem:
        return f"{base}_patch{patch}_{res}"
    return f"{base}_r_s{patch}_p8_{res}" if stem == "R" else f"{base}_{stem.lower()}_s{patch}_{res}"


def _timm_names() -> dict[str, str]:
    """timm's tagged name -> the registry's name of the same file."""
    def pick(name: str) -> str:
        return name + TIMM_SUFFIX if name + TIMM_SUFFIX in _OFFICIAL else name

    names = {}
    for variant, (_, finetunes) in _TIMM_AUGREG.items():
        names[f"{_timm_arch(variant, 224)}.augreg_in21k"] = pick(f"{variant}-augreg-i21k")
        for res in finetunes:
            names[f"{_timm_arch(variant, res)}.augreg_in21k_ft_in1k"] = \
                pick(f"{variant}-augreg-i21k-i1k-{res}")
    names.update({f"{_timm_arch(v, 224)}.orig_in21k": f"{v}-i21k" for v in _RELEASE_2020_I21K})
    names.update({f"{_timm_arch(v, res)}.orig_in21k_ft_in1k": f"{v}-i21k-i1k-{res}"
                  for v, res in _RELEASE_2020_I1K})
    return names


TIMM_NAMES = _timm_names()


def timm_tag_advice(text: str) -> str | None:
    """For a timm name with a weights tag that names no official file here (timm's own
    fine-tunes, "augreg2_in21k_ft_in1k", "augreg_in1k", ...): where its weights are and how
    to build its architecture. None for any other text."""
    match = TIMM_TAGGED_RE.match(text)
    if match is None:
        return None
    arch, tag = match["arch"], match["tag"]
    return (f"{text!r} is timm's name for its {tag} weights, which are not one of the "
            f"official files vitkit names: give hf-hub:timm/{arch}.{tag} instead for timm's "
            f"file (from the Hugging Face Hub, or its cache offline), or {arch} for the "
            "architecture alone. `vitkit models --checkpoints` lists the official files "
            "(timm's augreg_in21k, augreg_in21k_ft_in1k, orig_in21k and orig_in21k_ft_in1k "
            "names are read as them)")


@dataclass(frozen=True)
class NamedCheckpoint:
    """One row of `vitkit models --checkpoints`."""

    name: str
    url: str
    top1: float | None  # ImageNet-2012 validation top-1 in %, None where no source gives one
    top1_source: str = ""

    @property
    def augreg(self) -> bool:
        """One of the AugReg checkpoints ("How to train your ViT?"), not the 2020 release."""
        return "-augreg-" in self.name


def named_checkpoints() -> dict[str, str]:
    """Every known name and its download URL."""
    return {name: _url(path) for name, path in _OFFICIAL.items()}


def checkpoint_table() -> list[NamedCheckpoint]:
    """Every known name with its URL and expected top-1."""
    return [NamedCheckpoint(name, url, *TOP1.get(name, (None, "")))
            for name, url in named_checkpoints().items()]


def _url(path: str) -> str:
    return f"{BASE_URL}/{urllib.parse.quote(path)}"  # "+" -> "%2B", as the bucket expects


def _names_by_file() -> dict[str, str]:
    """Each listed file, as it may be written, -> its name: its path in the bucket
    ("augreg/<stem>.npz", "imagenet21k/ViT-B_16.npz", with or without ".npz") and, for AugReg,
    the bare file stem or file name (unique there, unlike the 2020 release's "ViT-B_16.npz")."""
    names = {}
    for name, path in _OFFICIAL.items():
        names[path] = names[path.removesuffix(".npz")] = name
    for name, stem in _AUGREG_STEMS.items():
        names[stem] = names[f"{stem}.npz"] = name
    return names


_NAMES_BY_FILE = _names_by_file()


def normalize_name(name: str) -> str | None:
    """The registry key for `name` ("ViT-B_16-i21k", "b16-i21k" and "B/16-i21k" agree), or
    for one of its files: the release file stem or name, its path in the bucket, its
    gs://vit_models/... address (as the official README writes it), its URL, or timm's name
    of it (`TIMM_NAMES`: "vit_base_patch16_224.augreg_in21k", "timm/" before it or not)."""
    if name.removeprefix("timm/") in TIMM_NAMES:
        return TIMM_NAMES[name.removeprefix("timm/")]
    path = urllib.parse.unquote(name)
    for prefix in ("gs://vit_models/", f"{BASE_URL}/"):
        path = path.removeprefix(prefix)
    if path in _NAMES_BY_FILE:
        return _NAMES_BY_FILE[path]

    def canon(text: str) -> str:
        return re.sub(r"[^a-z0-9+]", "", text.lower().replace("vit", ""))

    wanted = canon(_ALIASES.get(name, name))
    return next((key for key in _OFFICIAL if canon(key) == wanted), None)


# What the tag of a checkpoint name says about its model: "-i21k" is ImageNet-21k pre-training
# at 224 px, with a pre-logits layer of width D and a 21,843-way head; "-i21k-i1k-N" is
# fine-tuned on ImageNet-2012 at N px (1000 classes, pre-logits dropped). The weights are the
# official JAX port: tanh GELU, LayerNorm eps 1e-6. A "-timm" suffix (timm's AugReg pick)
# changes the file, not the model.
_CHECKPOINT_TAG_RE = re.compile(
    rf"^(?P<variant>.+?)(?P<augreg>-augreg)?-i21k(?:-i1k-(?P<size>\d+))?(?:{TIMM_SUFFIX})?$")
# AugReg ("-augreg-i21k...", "How to train your ViT?") has no pre-logits layer at all. Its
# "R+Ti/16" is the released R+ViT-Ti_16: 8x8 patches on the root block (vitkit's "R+Ti/32").
_AUGREG_VARIANTS = {"R+Ti/16": "R+ViT-Ti_16"}
_OFFICIAL_FIELDS = {"act": "gelu_tanh", "norm_eps": 1e-6, "init": "jax"}


def named_checkpoint_config(name: str) -> ViTConfig | None:
    """The config of a named official checkpoint ("R50+B/16-i21k", "B/16-i21k-i1k-384"),
    from the name alone (nothing is downloaded); None when `name` names no checkpoint."""
    key = normalize_name(name)
    match = _CHECKPOINT_TAG_RE.match(key) if key else None
    if match is None:
        return None
    variant, size = match["variant"], match["size"]
    if match["augreg"]:
        variant = _AUGREG_VARIANTS.get(variant, variant)
        return variant_config(variant, img_size=int(size or 224),
                              num_classes=1000 if size else 21843, **_OFFICIAL_FIELDS)
    if size is None:
        width = variant_config(variant).width
        return variant_config(variant, img_size=224, num_classes=21843, pre_logits_dim=width,
                              **_OFFICIAL_FIELDS)
    return variant_config(variant, img_size=int(size), num_classes=1000, **_OFFICIAL_FIELDS)


def local_filename(name: str) -> str:
    """The file name a named checkpoint has on disk: "imagenet21k_ViT-B_16.npz"."""
    return _OFFICIAL[name].replace("/", "_")


def cache_dir() -> Path:
    return cache_root()


def resolve_named(name: str, weights_dir: str | Path | None = None,
                  download: bool | None = None) -> Path:
    """Local path of a named checkpoint, downloading it into the cache if allowed. A file
    found by a bare name that two checkpoints share ("ViT-B_16.npz") is used only when its
    head says it is this one; else it is skipped and named in the not-found error."""
    key = normalize_name(name)
    if key is None:
        raise unknown_checkpoint_error(name)
    filename = local_filename(key)
    basename = _OFFICIAL[key].split("/")[-1]
    folders = [Path(p) for p in (weights_dir, os.environ.get("VITKIT_WEIGHTS_DIR")) if p]
    folders.append(cache_dir())
    skipped: list[tuple[Path, str]] = []  # (folder, why its file by the bare name is not it)
    for folder in folders:
        for candidate in (folder / filename, folder / _OFFICIAL[key]):
            if candidate.is_file():
                return candidate
        candidate = folder / basename
        if candidate.is_file():
            why = _not_this_checkpoint(candidate, key)
            if why is None:
                return candidate
            skipped.append((folder, why))
    if download is None:
        download = os.environ.get("VITKIT_OFFLINE", "0") in ("0", "", "false")
    url = _url(_OFFICIAL[key])
    # Where to tell the user to put it: in their --weights-dir, else beside the wrong file.
    put_at = None
    if weights_dir or skipped:
        put_at = (Path(weights_dir) if weights_dir else skipped[0][0]) / filename
    if not download:
        if skipped:
            raise WeightsNotFoundError(
                f"{key} is not on this machine and downloads are off. {skipped[0][1]}: "
                f"download that one ({url}) and save it as {put_at}.")
        places = str(put_at) if put_at else \
            "one of: " + ", ".join(str(f / filename) for f in folders) + \
            " (or pass --weights-dir FOLDER)"
        raise WeightsNotFoundError(
            f"{key} is not on this machine and downloads are off. Download {url} and put it "
            f"at {places}.")
    for _, why in skipped:
        log.warning("%s; downloading %s instead", why, key)
    try:
        return download_file(url, cache_dir() / filename, put_at=put_at)
    except WeightsNotFoundError as exc:
        if not skipped:
            raise
        raise WeightsNotFoundError(f"{exc} Not used: {skipped[0][1]}.") from exc


def _names_by_basename() -> dict[str, list[str]]:
    """Each file name -> the names whose file it is. The 2020 release names its files by
    variant alone, so "ViT-B_16.npz" is both B/16-i21k (imagenet21k/, the 21,843-class
    pre-training) and B/16-i21k-i1k-384 (imagenet21k+imagenet2012/, 1000 classes)."""
    names: dict[str, list[str]] = {}
    for name, path in _OFFICIAL.items():
        names.setdefault(path.rsplit("/", 1)[-1], []).append(name)
    return names


_NAMES_BY_BASENAME = _names_by_basename()


def _not_this_checkpoint(path: Path, key: str) -> str | None:
    """Why `path`, found by its bare file name, is not `key`'s file, or None when it is or
    may be. Only a name that other checkpoints share is checked, by the length of its
    `head/bias` (the classes); a file that is no readable .npz is left to its reader."""
    names = _NAMES_BY_BASENAME.get(path.name, [])
    if len(names) < 2:
        return None
    classes = _head_classes(path)
    wanted = named_checkpoint_config(key).num_classes
    if classes is None or classes == wanted:
        return None
    same = [n for n in names if n != key and named_checkpoint_config(n).num_classes == classes]
    what = f"{_OFFICIAL[same[0]]} (a {classes}-class head)" if len(same) == 1 else \
        f"a checkpoint with a {classes}-class head" if classes else "an .npz with no head/bias"
    return f"{path} is {what}, not {key}'s {_OFFICIAL[key]} ({wanted} classes)"


_HEAD_BIAS = tuple(f"{prefix}head/bias.npy" for prefix in ("", "opt/target/", "params/"))
_PROBE_ERRORS = (zipfile.BadZipFile, zlib.error, EOFError, OSError,
                 NotImplementedError, RuntimeError, struct.error, ValueError, OverflowError,
                 TypeError, SyntaxError, tokenize.TokenError, RecursionError, MemoryError)


def _head_classes(path: Path) -> int | None:
    """The length of the `head/bias` array of the .npz at `path`, from that member's .npy
    header alone (nothing else is read or decompressed): 0 for an .npz with none, None when
    `path` is no .npz whose header can be read (its reader then says what is wrong)."""
    try:
        with zipfile.ZipFile(path) as archive:
            members = archive.namelist()
            member = next((m for m in _HEAD_BIAS if m in members), None)
            if member is None:
                return 0 if any(m.endswith(".npy") for m in members) else None
            with archive.open(member) as data:
                version = np.lib.format.read_magic(data)
                read_header = np.lib.format.read_array_header_1_0 if version == (1, 0) \
                    else np.lib.format.read_array_header_2_0
                shape = read_header(data)[0]
    except _PROBE_ERRORS:
        return None
    return int(shape[0]) if len(shape) == 1 else None


def unknown_checkpoint_error(name: str) -> WeightsNotFoundError:
    """The error for weights asked for by a name that is neither a file nor a checkpoint."""
    return WeightsNotFoundError(
        f"{name!r} is neither a file nor a known checkpoint name."
        + did_you_mean(name, [*_OFFICIAL, *_AUGREG_STEMS.values()])
        + f" Known names: {', '.join(_OFFICIAL)}.")


def download_file(url: str, target: Path, put_at: Path | None = None) -> Path:
    """Download to a temporary file beside `target`, then rename (never a partial file).
    `put_at`: where the error tells an offline user to put the file (default: `target`, or
    a --weights-dir)."""
    from tqdm.auto import tqdm

    target.parent.mkdir(parents=True, exist_ok=True)

    def fetch(out: BinaryIO) -> None:
        with urllib.request.urlopen(url, timeout=60) as response:
            total = int(response.headers.get("Content-Length", 0)) or None
            with tqdm(total=total, unit="B", unit_scale=True, desc=target.name) as bar:
                while chunk := response.read(1 << 20):
                    out.write(chunk)
                    bar.update(len(chunk))

    try:
        write_atomic(target, fetch, suffix=".part")
    except OSError as exc:
        place = put_at or f"{target} or pass --weights-dir FOLDER"
        raise WeightsNotFoundError(
            f"could not download {url} ({exc}). Offline, download it elsewhere and put it at "
            f"{place}.") from exc
    return target

