"""timm `VisionTransformer` state dicts: vitkit uses the same parameter names, so conversion
is a check of what is supported and an inference of the config from the tensor shapes."""

from __future__ import annotations

import importlib.util
import logging
import math
import re
from typing import Any

import torch

from vitkit.config import HEADS_BY_WIDTH, TIMM_POOLS, ViTConfig, is_variant_name, variant_config
from vitkit.errors import CheckpointError, ConfigError
from vitkit.fieldtypes import check_value
from vitkit.model.resnet import ResNetBackbone
from vitkit.preprocess import IMAGENET_MEAN, IMAGENET_STD, Preprocess, official_preprocess
from vitkit.weights.formats.base import ReadOptions, training_image_size
from vitkit.weights.formats.sniff import Found, missing_weights
from vitkit.weights.record import WeightsRecord

log = logging.getLogger("vitkit.weights")

_UNSUPPORTED = {
    "reg_token": "register tokens",
    ".ls1.": "LayerScale",
    ".q_norm.": "query/key normalisation",
    "attn_pool.": "attention pooling (MAP head)",
    "norm_pre.": "a pre-encoder LayerNorm",
}


def convert_timm(state_dict: dict[str, torch.Tensor], num_heads: int | None = None,
                 img_size: int | tuple[int, int] | None = None, global_pool: str | None = None,
                 target_img_size: int | tuple[int, int] | None = None, **overrides: Any
                 ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """Config and vitkit state dict from a timm ViT state dict.

    Shapes give width, depth, MLP size, patch size, channels, classes, class token, qkv bias
    and which final norm is used. Heads are taken from the width when it is a standard one
    (else pass `num_heads`). `img_size` is the training resolution, read from a square
    position grid; a non-square one needs it, or a `target_img_size` with as many patches.
    `global_pool` is timm's ("token" or "avg"), inferred when not given.
    """
    for marker, what in _UNSUPPORTED.items():
        if any(marker in key for key in state_dict):
            raise CheckpointError(f"this timm checkpoint uses {what}, which vitkit's ViT does "
                                  "not have")
    unknown = sorted(k for k in state_dict if k not in _KEEP and not _BLOCK_KEY.match(k)
                     and not k.startswith("patch_embed.backbone."))
    if unknown:
        raise CheckpointError(f"not a plain timm ViT state dict: unknown keys "
                              f"{', '.join(unknown[:6])}")
    sd = dict(state_dict)
    if "patch_embed.backbone.conv.weight" in sd:  # root-only hybrid: timm's stem, no stages
        sd = {k.replace("patch_embed.backbone.", "patch_embed.backbone.stem.", 1)
              if k.startswith("patch_embed.backbone.") else k: v for k, v in sd.items()}
    try:
        proj = _shaped(sd, "patch_embed.proj.weight", 4)
        pos = _shaped(sd, "pos_embed", 3) if "pos_embed" in sd else None
        fc1 = _shaped(sd, "blocks.0.mlp.fc1.weight", 2)
    except KeyError as exc:
        raise CheckpointError(f"not a timm ViT state dict: {exc.args[0]} is missing") from None
    width, in_chans, patch = proj.shape[0], proj.shape[1], proj.shape[2]
    if proj.shape[2] != proj.shape[3] or min(proj.shape) < 1:
        raise CheckpointError(f"patch_embed.proj.weight has shape {tuple(proj.shape)}, expected "
                              "(width, channels, P, P) with square non-empty patches")
    hybrid: dict[str, Any] = {}
    if "patch_embed.backbone.stem.conv.weight" in sd:  # R50+ViT etc.: the ResNet stem
        root = _shaped(sd, "patch_embed.backbone.stem.conv.weight", 4)
        units: dict[int, int] = {}
        for key in sd:
            match = re.match(r"^patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\.", key)
            if match:
                stage, unit = int(match.group(1)), int(match.group(2))
                units[stage] = max(units.get(stage, 0), unit + 1)
        _check_contiguous(units, "patch_embed.backbone.stages")
        layers = tuple(units[i] for i in range(len(units)))
        hybrid = dict(stem="resnet", resnet_layers=layers, resnet_width=root.shape[0],
                      resnet_norm="timm")  # timm's constants: its outputs are reproduced
        in_chans, patch = root.shape[1], patch * ResNetBackbone.total_stride(layers)
    class_token = "cls_token" in sd
    if img_size is None:
        if pos is None:
            raise CheckpointError("no position embeddings in the checkpoint: pass "
                                  "source_img_size=(height, width), its training resolution")
        try:
            img_size = training_image_size(pos.shape[1] - int(class_token), patch, None,
                                           target_img_size)
        except CheckpointError as exc:
            note = _no_class_row_note(pos.shape[1], class_token)
            raise CheckpointError(f"{str(exc).rstrip('.')}{note}." if note else str(exc)
                                  ) from None
    if num_heads is None:
        if width not in HEADS_BY_WIDTH:
            raise HeadsUnknown(f"width {width} is not a standard ViT width, so the number of "
                               "heads cannot be inferred from the tensors: pass num_heads=N")
        num_heads = HEADS_BY_WIDTH[width]
    pooled_norm = "fc_norm.weight" in sd
    if global_pool is None:
        global_pool = "avg" if pooled_norm or not class_token else "token"
    pool = TIMM_POOLS.get(global_pool)
    if pool is None:
        raise ConfigError(f"global_pool={global_pool!r} is not supported; use 'token' or 'avg'")
    blocks = {int(_BLOCK_KEY.match(k).group(1)): 1 for k in sd if _BLOCK_KEY.match(k)}
    _check_contiguous(blocks, "blocks")
    config = ViTConfig(
        img_size=img_size, patch_size=patch, in_chans=in_chans,
        num_classes=_shaped(sd, "head.weight", 2).shape[0] if "head.weight" in sd else 0,
        width=width, depth=len(blocks),
        num_heads=num_heads, mlp_dim=fc1.shape[0], qkv_bias="blocks.0.attn.qkv.bias" in sd,
        class_token=class_token, pool=pool,
        final_norm="pooled" if pooled_norm else ("tokens" if "norm.weight" in sd else "none"),
        pos_embed="learned" if pos is not None else "none", init="trunc_normal", **hybrid,
    )
    return (config.replace(**overrides) if overrides else config), sd


def _no_class_row_note(rows: int, class_token: bool) -> str:
    """For positions that form no grid after the class token's row: when all of them form a
    square one, the file may be timm's `no_embed_class` layout (FlexiViT, DeiT III: no
    position for the class token), which shapes alone cannot tell from a non-square grid
    (225 rows: 15x15, or 14x16 and the class token's)."""
    grid = math.isqrt(rows)
    if not class_token or grid * grid != rows:
        return ""
    return (f". Or, if the file is timm's no_embed_class layout ({rows} rows = a {grid}x{grid} "
            "grid with no row for the class token: FlexiViT, DeiT III), vitkit cannot read it: "
            "its ViT adds a position to the class token, as the paper's does, and would read "
            "the table shifted by one row")


class HeadsUnknown(CheckpointError):
    """A timm state dict whose head count neither its width nor its config tells."""


def _heads_advice(path: object) -> str:
    """How to give the head count: in Python, and once for the command line."""
    return (f"load_pretrained({str(path)!r}, num_heads=N); for the command line, "
            "convert the file once to a vitkit folder, which records it: python -c \"import "
            f"vitkit; vitkit.save_pretrained(vitkit.load_pretrained({str(path)!r}, "
            "num_heads=N), 'FOLDER')\" and give FOLDER to the verbs")


def _heads_from_config(meta: dict[str, Any]) -> int | None:
    """The head count a timm config.json gives: `model_args.num_heads`, else its
    `architecture` when that is a variant name (vit_base_patch16_224), else the architecture
    built by timm (when installed) on the meta device, which allocates nothing. None when
    none tells."""
    args = meta.get("model_args")
    args = args if isinstance(args, dict) else {}
    if isinstance(args.get("num_heads"), int) and args["num_heads"] > 0:
        return args["num_heads"]
    architecture = meta.get("architecture")
    if not isinstance(architecture, str):
        return None
    if is_variant_name(architecture):
        try:
            return variant_config(architecture).num_heads
        except ConfigError:
            pass
    try:
        import timm
    except ImportError:
        return None
    try:
        with torch.device("meta"):
            model = timm.create_model(architecture, pretrained=False, **args)
        return int(model.blocks[0].attn.num_heads)
    except (RuntimeError, TypeError, ValueError, AttributeError, KeyError, IndexError):
        return None  # not a timm model name, or not a ViT: the width decides, as for a file


def _shaped(sd: dict[str, torch.Tensor], key: str, ndim: int) -> torch.Tensor:
    """sd[key], which must have `ndim` dimensions (KeyError when absent)."""
    tensor = sd[key]
    if tensor.dim() != ndim:
        raise CheckpointError(f"the tensor {key!r} has shape {tuple(tensor.shape)}, expected "
                              f"{ndim} dimensions: the file is damaged or not a plain ViT")
    return tensor


def _check_contiguous(indices: dict[int, int], what: str) -> None:
    """Blocks (or stages) numbered 0..n-1 with none missing."""
    absent = sorted(set(range(max(indices, default=-1) + 1)) - set(indices))
    if absent:
        raise CheckpointError(f"{what} {absent[:8]} are missing (the file has "
                              f"{what} {sorted(indices)[:8]}): the file is incomplete; "
                              "download it again")


_KEEP = {"cls_token", "pos_embed", "patch_embed.proj.weight", "patch_embed.proj.bias",
         "norm.weight", "norm.bias", "fc_norm.weight", "fc_norm.bias", "head.weight", "head.bias"}
_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(norm1|norm2|attn\.qkv|attn\.proj|mlp\.fc1|mlp\.fc2)"
                        r"\.(weight|bias)$")


def config_from_timm_model(model: torch.nn.Module) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """Config and state dict from a live timm `VisionTransformer` (reads heads and pooling)."""
    return convert_timm(model.state_dict(), num_heads=model.blocks[0].attn.num_heads,
                        img_size=tuple(model.patch_embed.img_size),
                        global_pool=model.global_pool or "token")


# -- the adapter -------------------------------------------------------------------------------
def looks_like_timm(state_dict: dict[str, torch.Tensor] | None) -> bool:
    return state_dict is not None and "patch_embed.proj.weight" in state_dict


def detect(found: Found) -> bool:
    """A timm Hub folder (config.json with `pretrained_cfg`/`architecture`), or a file
    holding a timm-named state dict."""
    if found.kind == "folder":
        meta = found.config() or {}
        return "pretrained_cfg" in meta or "architecture" in meta
    return looks_like_timm(found.tensors())


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    try:
        return _read(found, options)
    except (CheckpointError, ConfigError) as exc:
        advice = f": {_heads_advice(found.path)}" if isinstance(exc, HeadsUnknown) else ""
        raise CheckpointError(f"{found.path} cannot be read as timm ViT weights: {exc}"
                              f"{advice}") from None


def _read(found: Found, options: ReadOptions) -> WeightsRecord:
    if found.kind == "folder":
        return _read_folder(found, options)
    config, state_dict = convert_timm(found.tensors(), img_size=options.source_img_size,
                                      target_img_size=options.img_size, **options.timm_hints())
    hints = options.timm_hints()
    pool, other = ("avg", "token") if config.pool == "mean_patches" else ("token", "avg")
    pooling = "" if "global_pool" in hints or not config.class_token else (
        f"; pooled as timm's global_pool='{pool}' (timm's default "
        f"{'with' if config.final_norm == 'pooled' else 'without'} fc_norm; a model built "
        f"with '{other}' needs load_pretrained(path, global_pool='{other}'))")
    log.info("%s: timm weights without a pretrained config; assuming mean=std=0.5 (the "
             "official and augreg ViTs)%s%s", found.path, "" if "num_heads" in hints
             else f" and {config.num_heads} heads, the standard count "
             f"for width {config.width} (a model with others, such as timm's "
             "vit_base_patch16_gap_224 with 16, needs load_pretrained(path, num_heads=N))",
             pooling)
    return WeightsRecord(config, state_dict, official_preprocess(config.img_size, config.in_chans),
                         "timm", path=found.path)


def _read_folder(found: Found, options: ReadOptions) -> WeightsRecord:
    """A timm Hub folder: config.json (`architecture`, `global_pool`, `pretrained_cfg` with
    input_size, mean, std, crop_pct, interpolation, label_names) + model.safetensors or
    pytorch_model.bin, as timm's save_for_hf / push_to_hf_hub write it."""
    weights = found.weights_file()
    if weights is None:
        raise missing_weights(found.path)
    meta = found.config() or {}
    cfg = meta.get("pretrained_cfg", {})
    if not isinstance(cfg, dict):
        raise CheckpointError(f"'pretrained_cfg' in {found.path / 'config.json'} is a "
                              f"{type(cfg).__name__}, expected an object: restore the file")
    hints = options.timm_hints()
    if "global_pool" not in hints and meta.get("global_pool") in ("token", "avg"):
        hints["global_pool"] = meta["global_pool"]
    if "num_heads" not in hints and (heads := _heads_from_config(meta)) is not None:
        hints["num_heads"] = heads
    elif "num_heads" not in hints and isinstance(meta.get("architecture"), str):
        why = "timm, which is not installed" if importlib.util.find_spec("timm") is None \
            else "timm, which could not build it"
        log.warning("%s names the architecture %s, whose head count only %s could tell: the "
                    "standard count for its width is assumed; if the model had others, pass "
                    "num_heads=N", found.path / "config.json", meta["architecture"], why)
    config, state_dict = convert_timm(found.tensors() or {}, img_size=options.source_img_size,
                                      target_img_size=options.img_size or _input_size(cfg),
                                      **hints)
    settings = {"crop_pct": cfg.get("crop_pct", 1.0),
                "interpolation": cfg.get("interpolation", "bicubic"),
                "mean": cfg.get("mean", IMAGENET_MEAN), "std": cfg.get("std", IMAGENET_STD)}
    for key, value in settings.items():
        check_value(Preprocess, key, value, f"pretrained_cfg.{key}", what="preprocess")
    preprocess = Preprocess(img_size=config.img_size, resize_mode=_resize_mode(cfg, found),
                            **settings)
    return WeightsRecord(config, state_dict, preprocess, "timm",
                         _label_names(meta, cfg, config.num_classes), path=weights)


def _resize_mode(cfg: dict[str, Any], found: Found) -> str:
    """Preprocess's resize mode for timm's `crop_mode`: "center" (the default) is
    "shorter_side", "squash" is "squash" (each side to size / crop_pct, then the crop);
    "border" (pad rather than crop) has no equivalent: read as "center", with a warning."""
    mode = cfg.get("crop_mode", "center")
    if mode == "squash":
        return "squash"
    if mode not in ("center", None):
        log.warning("%s: timm's crop_mode %r has no vitkit equivalent; images are resized and "
                    "centre-cropped (crop_mode 'center') instead", found.path / "config.json",
                    mode)
    return "shorter_side"


def _input_size(cfg: dict[str, Any]) -> tuple[int, int] | None:
    """pretrained_cfg["input_size"] ([C, H, W]) as (H, W): the training resolution, which
    settles a non-square position grid."""
    size = cfg.get("input_size")
    if isinstance(size, list | tuple) and len(size) == 3 and \
            all(isinstance(v, int) and v > 0 for v in size):
        return (size[1], size[2])
    return None


def _label_names(meta: dict[str, Any], cfg: dict[str, Any], num_classes: int
                 ) -> list[str] | None:
    """Class names from `label_names` (top level or pretrained_cfg) when one per class."""
    names = meta.get("label_names", cfg.get("label_names"))
    if isinstance(names, list) and len(names) == num_classes and num_classes and \
            all(isinstance(n, str) for n in names):
        return names
    return None
