"""Hugging Face `ViTModel` / `ViTForImageClassification` weights in vitkit's layout.

Both key styles are read: the Hub's (`encoder.layer.N.attention.attention.query`, as written
by transformers 4.x) and transformers 5's (`layers.N.attention.q_proj`). Separate q, k, v
projections are stacked into vitkit's fused qkv. The pooler (Linear + tanh on the class
token) is the paper's pre-logits layer.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import torch

from vitkit.config import HEADS_BY_WIDTH, ViTConfig
from vitkit.errors import CheckpointError, ConfigError
from vitkit.fieldtypes import check_value
from vitkit.files import read_json
from vitkit.preprocess import Preprocess, crop_fraction, official_preprocess
from vitkit.tasks import TaskSpec, distinct_output_names
from vitkit.weights.formats.base import ReadOptions, training_image_size
from vitkit.weights.formats.sniff import Found, missing_weights
from vitkit.weights.record import WeightsRecord, check_config_fits

log = logging.getLogger("vitkit.weights")

_RENAMES = [
    (r"embeddings\.cls_token", "cls_token"),
    (r"embeddings\.position_embeddings", "pos_embed"),
    (r"embeddings\.patch_embeddings\.projection\.", "patch_embed.proj."),
    (r"(?:encoder\.layer|layers)\.(\d+)\.attention\.attention\.(query|key|value)\.",
     r"blocks.\1.attn.\2."),
    (r"layers\.(\d+)\.attention\.([qkv])_proj\.", r"blocks.\1.attn.\2."),
    (r"(?:encoder\.layer|layers)\.(\d+)\.attention\.(?:output\.dense|o_proj)\.",
     r"blocks.\1.attn.proj."),
    (r"(?:encoder\.layer|layers)\.(\d+)\.(?:intermediate\.dense|mlp\.fc1)\.",
     r"blocks.\1.mlp.fc1."),
    (r"(?:encoder\.layer|layers)\.(\d+)\.(?:output\.dense|mlp\.fc2)\.", r"blocks.\1.mlp.fc2."),
    (r"(?:encoder\.layer|layers)\.(\d+)\.layernorm_before\.", r"blocks.\1.norm1."),
    (r"(?:encoder\.layer|layers)\.(\d+)\.layernorm_after\.", r"blocks.\1.norm2."),
    (r"layernorm\.", "norm."),
    (r"pooler\.dense\.", "pre_logits.fc."),
    (r"classifier\.", "head."),
]
_QKV_ALIASES = {"query": "q", "key": "k", "value": "v"}
_IGNORED = ("embeddings.mask_token",)


def _rename(key: str) -> str:
    key = key.removeprefix("vit.")
    for pattern, replacement in _RENAMES:
        new, count = re.subn(f"^{pattern}", replacement, key)
        if count:
            return new
    raise CheckpointError(f"not a Hugging Face ViT weight: {key!r}")


def _setting(config: Any, name: str, default: Any = None) -> Any:
    """A config value; a missing or null one is `default`."""
    value = config.get(name) if isinstance(config, dict) else getattr(config, name, None)
    return default if value is None else value


def convert_hf(state_dict: dict[str, torch.Tensor], hf_config: Any
               ) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """Config and vitkit state dict from a HF ViT state dict and its config (object or dict)."""
    renamed: dict[str, torch.Tensor] = {}
    for key, tensor in state_dict.items():
        if key.removeprefix("vit.") in _IGNORED:
            continue
        renamed[_rename(key)] = tensor
    qkv_parts: dict[str, dict[str, torch.Tensor]] = {}
    sd: dict[str, torch.Tensor] = {}
    for key, tensor in renamed.items():
        match = re.match(r"^(blocks\.\d+\.attn)\.(query|key|value|q|k|v)\.(weight|bias)$", key)
        if match:
            part = _QKV_ALIASES.get(match.group(2), match.group(2))
            qkv_parts.setdefault(f"{match.group(1)}.qkv.{match.group(3)}", {})[part] = tensor
        else:
            sd[key] = tensor
    for key, parts in qkv_parts.items():
        absent = [name for name in ("q", "k", "v") if name not in parts]
        if absent:
            raise CheckpointError(f"{key}: the {'/'.join(absent)} projection is missing (only "
                                  f"{'/'.join(sorted(parts))} found): the file is incomplete; "
                                  "download it again")
        shapes = {name: tuple(parts[name].shape) for name in ("q", "k", "v")}
        if len(set(shapes.values())) != 1:
            raise CheckpointError(f"{key}: the q, k and v projections differ in shape "
                                  f"({shapes}): the file is damaged; download it again")
        sd[key] = torch.cat([parts["q"], parts["k"], parts["v"]], dim=0)
    return config_from_hf(hf_config, has_head="head.weight" in sd,
                          has_pre_logits="pre_logits.fc.weight" in sd), sd


def config_from_hf(hf_config: Any, has_head: bool = True, has_pre_logits: bool = False
                   ) -> ViTConfig:
    """Translate a HF `ViTConfig` (object or config.json dict) into a vitkit config."""
    act = _setting(hf_config, "hidden_act", "gelu")
    acts = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}
    if act not in acts:
        raise CheckpointError(f"hidden_act={act!r} is not supported; vitkit has {', '.join(acts)}")
    if has_pre_logits and _setting(hf_config, "pooler_act", "tanh") != "tanh":
        raise CheckpointError("only a tanh pooler maps to the paper's pre-logits layer")
    patch = _setting(hf_config, "patch_size", 16)
    if not isinstance(patch, int):
        if patch[0] != patch[1]:
            raise CheckpointError(f"non-square patches {patch} are not supported")
        patch = patch[0]
    num_labels = _setting(hf_config, "num_labels", None)
    if num_labels is None:
        num_labels = len(_setting(hf_config, "id2label", None) or {}) or 2
    hidden = _setting(hf_config, "hidden_size", 768)
    pre_logits_dim = 0
    if has_pre_logits:
        pre_logits_dim = _setting(hf_config, "pooler_output_size", None) or hidden
    return ViTConfig(
        img_size=_setting(hf_config, "image_size", 224), patch_size=patch,
        in_chans=_setting(hf_config, "num_channels", 3),
        num_classes=num_labels if has_head else 0,
        width=hidden, depth=_setting(hf_config, "num_hidden_layers", 12),
        num_heads=_setting(hf_config, "num_attention_heads", 12),
        mlp_dim=_setting(hf_config, "intermediate_size", 3072),
        qkv_bias=_setting(hf_config, "qkv_bias", True), act=acts[act],
        norm_eps=_setting(hf_config, "layer_norm_eps", 1e-12), pre_logits_dim=pre_logits_dim,
        init="trunc_normal",
    )


# -- the adapter -------------------------------------------------------------------------------
_MODEL_TYPES = ("vit", "vit-hybrid")
_RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}  # PIL codes


def looks_like_hf(state_dict: dict[str, torch.Tensor] | None) -> bool:
    return state_dict is not None and any(
        k.removeprefix("vit.").startswith(("embeddings.", "encoder.layer.", "layers."))
        for k in state_dict)


def detect(found: Found) -> bool:
    """A folder whose config.json says model_type "vit" (or holds HF-named weights and no
    other format's config), or a file holding a HF-named state dict."""
    if found.kind == "folder":
        meta = found.config()
        if meta is None or "format" in meta or "pretrained_cfg" in meta:
            return False
        return meta.get("model_type") in _MODEL_TYPES or looks_like_hf(found.tensors())
    return looks_like_hf(found.tensors())


# config.json keys vitkit reads, and the JSON types they must have.
_INT, _NUMBER = (int,), (int, float)
_CONFIG_TYPES: dict[str, tuple[tuple[type, ...], str]] = {
    **{key: (_INT, "an integer") for key in (
        "hidden_size", "num_hidden_layers", "num_attention_heads", "intermediate_size",
        "num_channels", "num_labels", "pooler_output_size")},
    "image_size": ((int, list), "an integer or [height, width]"),
    "patch_size": ((int, list), "an integer or [height, width]"),
    "layer_norm_eps": (_NUMBER, "a number"),
    "qkv_bias": ((bool,), "true or false"),
    "hidden_act": ((str,), "a string"), "pooler_act": ((str,), "a string"),
    "id2label": ((dict,), "an object of index: label"),
}


def check_config_types(meta: dict[str, Any], path: object) -> None:
    """Each config.json key vitkit reads has its JSON type (bool is not an integer)."""
    for key, (types, what) in _CONFIG_TYPES.items():
        value = meta.get(key)
        if value is None:
            continue
        wrong = not isinstance(value, types) or (bool not in types and isinstance(value, bool))
        if isinstance(value, list):
            wrong = wrong or len(value) != 2 or not all(
                isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value)
        if wrong:
            raise CheckpointError(f"{path}: {key!r} is {value!r}, expected {what}; fix "
                                  "config.json or download the model folder again")
    labels = meta.get("id2label") or {}
    if not all(str(k).isdigit() for k in labels):
        raise CheckpointError(f"{path}: 'id2label' keys must be class indices (\"0\", \"1\", "
                              "...); fix config.json or download the model folder again")


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    try:
        return _read(found, options)
    except (CheckpointError, ConfigError) as exc:
        raise CheckpointError(f"{found.path} cannot be read as Hugging Face ViT weights: "
                              f"{exc}") from None


def _read(found: Found, options: ReadOptions) -> WeightsRecord:
    tensors = found.tensors()
    if tensors is None:
        raise missing_weights(found.path)
    if found.kind == "folder":
        meta = found.config() or {}
        check_config_types(meta, found.path / "config.json")
        config, state_dict = convert_hf(tensors, meta)
        check_config_fits(config, state_dict, found.path)
        labels = _labels(meta)
        return WeightsRecord(config, state_dict, _folder_preprocess(found, config),
                             "huggingface", labels, path=found.weights_file(),
                             task=_task(meta.get("problem_type"), labels))
    meta = _config_from_shapes(tensors, options)
    config, state_dict = convert_hf(tensors, meta)
    return WeightsRecord(config, state_dict, official_preprocess(config.img_size, config.in_chans),
                         "huggingface", path=found.path)


def _config_from_shapes(sd: dict[str, torch.Tensor], options: ReadOptions) -> dict[str, Any]:
    """A Hugging Face config for a loose HF state dict (no config.json): HF's defaults."""
    proj = _find(sd, ("patch_embeddings.projection.weight",), 4)
    pos = _find(sd, ("position_embeddings",), 3)
    fc1 = _find(sd, ("intermediate.dense.weight", "mlp.fc1.weight"), 2)
    layers = {int(m.group(1)) for m in map(_LAYER_KEY.match, sd) if m}
    absent = sorted(set(range(max(layers, default=-1) + 1)) - layers)
    if absent or not layers:
        raise CheckpointError(f"encoder layers {absent[:8] or [0]} are missing: the file is "
                              "incomplete; download it again")
    width, patch = proj.shape[0], proj.shape[2]
    head = next((v for k, v in sd.items() if k == "classifier.weight"), None)
    if width not in HEADS_BY_WIDTH:
        raise CheckpointError(f"width {width} is not a standard ViT width; pass the model "
                              "folder with its config.json")
    image_size = training_image_size(pos.shape[1] - 1, patch, options.source_img_size,
                                     options.img_size)
    if pos.shape[1] < 2:
        raise CheckpointError(f"the position embeddings have shape {tuple(pos.shape)}: no "
                              "rows for the patches")
    return {"hidden_size": width, "num_hidden_layers": len(layers), "patch_size": patch,
            "num_channels": proj.shape[1], "image_size": image_size,
            "intermediate_size": fc1.shape[0], "num_attention_heads": HEADS_BY_WIDTH[width],
            "num_labels": head.shape[0] if head is not None else 2,
            "qkv_bias": any(k.endswith(("query.bias", "q_proj.bias")) for k in sd)}


_LAYER_KEY = re.compile(r"^(?:vit\.)?(?:encoder\.layer|layers)\.(\d+)\.")


def _find(sd: dict[str, torch.Tensor], suffixes: tuple[str, ...], ndim: int) -> torch.Tensor:
    """The tensor whose name ends with one of `suffixes`, of `ndim` dimensions."""
    key = next((k for k in sd if k.endswith(suffixes)), None)
    if key is None:
        raise CheckpointError(f"no tensor named '...{suffixes[0]}' in the file: it is "
                              "incomplete or not a Hugging Face ViT; download it again")
    if sd[key].dim() != ndim:
        raise CheckpointError(f"the tensor {key!r} has shape {tuple(sd[key].shape)}, expected "
                              f"{ndim} dimensions: the file is damaged; download it again")
    return sd[key]


# transformers' `problem_type` (the loss its ForImageClassification models train with) as
# vitkit's task: regression is MSE on the raw targets (no standardisation stored).
_PROBLEM_TYPES = {"single_label_classification": None, "regression": "regression",
                  "multi_label_classification": "multilabel"}


def _task(problem_type: Any, labels: list[str] | None) -> TaskSpec | None:
    """config.json's `problem_type` as a task (absent: classification, as transformers
    infers it for integer labels)."""
    if problem_type is None:
        return None
    if problem_type not in _PROBLEM_TYPES:
        raise CheckpointError(f"'problem_type' is {problem_type!r}, not one of "
                              f"{', '.join(_PROBLEM_TYPES)}; fix config.json")
    kind = _PROBLEM_TYPES[problem_type]
    if not kind:
        return None
    return TaskSpec(kind, names=None if labels is None else distinct_output_names(labels))


def _labels(meta: dict[str, Any]) -> list[str] | None:
    labels = meta.get("id2label")
    if not labels or all(str(v).startswith("LABEL_") for v in labels.values()):
        return None
    return [str(labels[k]) for k in sorted(labels, key=int)]


def _folder_preprocess(found: Found, config: ViTConfig) -> Preprocess:
    path = found.path / "preprocessor_config.json"
    if not path.is_file():
        return official_preprocess(config.img_size, config.in_chans)
    data = read_json(path, CheckpointError, "restore or re-download it")
    if not isinstance(data, dict):
        raise CheckpointError(f"{path} holds a {type(data).__name__}, expected a JSON object")
    settings = {"mean": data.get("image_mean", (0.5,) * config.in_chans),
                "std": data.get("image_std", (0.5,) * config.in_chans)}
    for key, value in settings.items():
        check_value(Preprocess, key, value, f"image_{key}", what="preprocess")
    resample = data.get("resample", 2)
    return Preprocess(img_size=config.img_size, **settings, **_crop(data, config, path),
                      interpolation=_RESAMPLE.get(resample, "bilinear")
                      if isinstance(resample, int) else "bilinear")


def _sides(value: Any) -> tuple[int | None, int | None]:
    """(height, width) of a processor's `size` / `crop_size`: an int, or a dict of height and
    width; (shortest_edge, None) for {"shortest_edge": N}; (None, None) otherwise."""
    if isinstance(value, int):
        return value, value
    if isinstance(value, dict) and isinstance(value.get("shortest_edge"), int):
        return value["shortest_edge"], None
    if isinstance(value, dict) and all(isinstance(value.get(k), int) for k in ("height", "width")):
        return value["height"], value["width"]
    return None, None


def _crop(data: dict[str, Any], config: ViTConfig, path: Path) -> dict[str, Any]:
    """The resize mode and crop_pct of a processor that resizes, then centre-crops the model's
    size (`do_center_crop`, as DeiT's: 256x256, then 224): "squash" to `size`, or the shorter
    side to `shortest_edge`. None of it without a centre crop (ViT's processors resize
    straight to the model's size). Its crop offsets are floored, as transformers' are."""
    if not data.get("do_center_crop") or data.get("do_resize") is False:
        return {}
    (crop_h, crop_w), (size_h, size_w) = _sides(data.get("crop_size")), _sides(data.get("size"))
    if (crop_h, crop_w) != tuple(config.img_size) or size_h is None:
        log.warning("%s: its centre crop (crop_size %s of size %s) does not crop the model's "
                    "%dx%d; images are resized to the model's size instead", path,
                    data.get("crop_size"), data.get("size"), *config.img_size)
        return {}
    if size_w is None:  # {"shortest_edge": N}: the shorter side to N, then the crop
        return {"resize_mode": "shorter_side", "crop_offset": "floor",
                "crop_pct": crop_fraction(min(crop_h, crop_w), size_h)}
    if size_h * crop_w != size_w * crop_h:
        log.warning("%s: its resize (%dx%d) and crop (%dx%d) differ in shape; the crop is "
                    "taken as a fraction of the height", path, size_h, size_w, crop_h, crop_w)
    return {"resize_mode": "squash", "crop_offset": "floor",
            "crop_pct": crop_fraction(crop_h, size_h)}
