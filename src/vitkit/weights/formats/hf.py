"""Hugging Face `ViTModel` / `ViTForImageClassification` weights in vitkit's layout.

Both key styles are read: the Hub's (`encoder.layer.N.attention.attention.query`, as written
by transformers 4.x) and transformers 5's (`layers.N.attention.q_proj`). Separate q, k, v
projections are stacked into vitkit's fused qkv. The pooler (Linear + tanh on the class
token) is the paper's pre-logits layer.
"""

from __future__ import annotations

import json
import re
from typing import Any

import torch

from vitkit.config import HEADS_BY_WIDTH, ViTConfig
from vitkit.data.preprocess import Preprocess, official_preprocess
from vitkit.errors import CheckpointError
from vitkit.weights.formats.base import ReadOptions, training_image_size
from vitkit.weights.formats.sniff import Found
from vitkit.weights.record import WeightsRecord

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
    return config.get(name, default) if isinstance(config, dict) else getattr(config, name, default)


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


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    tensors = found.tensors()
    if tensors is None:
        raise CheckpointError(f"{found.path} has no model.safetensors or pytorch_model.bin")
    if found.kind == "folder":
        meta = found.config() or {}
        config, state_dict = convert_hf(tensors, meta)
        return WeightsRecord(config, state_dict, _folder_preprocess(found, config),
                             "huggingface", _labels(meta), path=found.weights_file())
    meta = _config_from_shapes(tensors, options)
    config, state_dict = convert_hf(tensors, meta)
    return WeightsRecord(config, state_dict, official_preprocess(config.img_size, config.in_chans),
                         "huggingface", path=found.path)


def _config_from_shapes(sd: dict[str, torch.Tensor], options: ReadOptions) -> dict[str, Any]:
    """A Hugging Face config for a loose HF state dict (no config.json): HF's defaults."""
    proj = next(v for k, v in sd.items() if k.endswith("patch_embeddings.projection.weight"))
    pos = next(v for k, v in sd.items() if k.endswith("position_embeddings"))
    fc1 = next(v for k, v in sd.items() if k.endswith(("intermediate.dense.weight",
                                                       "mlp.fc1.weight")))
    layers = {k.split(".")[2 if k.startswith("vit.") else 1] for k in sd
              if ".layer." in k or k.removeprefix("vit.").startswith("layers.")}
    width, patch = proj.shape[0], proj.shape[2]
    head = next((v for k, v in sd.items() if k == "classifier.weight"), None)
    if width not in HEADS_BY_WIDTH:
        raise CheckpointError(f"width {width} is not a standard ViT width; pass the model "
                              "folder with its config.json")
    image_size = training_image_size(pos.shape[1] - 1, patch, options.source_img_size,
                                     options.img_size)
    return {"hidden_size": width, "num_hidden_layers": len(layers), "patch_size": patch,
            "num_channels": proj.shape[1], "image_size": image_size,
            "intermediate_size": fc1.shape[0], "num_attention_heads": HEADS_BY_WIDTH[width],
            "num_labels": head.shape[0] if head is not None else 2,
            "qkv_bias": any(k.endswith(("query.bias", "q_proj.bias")) for k in sd)}


def _labels(meta: dict[str, Any]) -> list[str] | None:
    labels = meta.get("id2label")
    if not labels or all(str(v).startswith("LABEL_") for v in labels.values()):
        return None
    return [labels[k] for k in sorted(labels, key=int)]


def _folder_preprocess(found: Found, config: ViTConfig) -> Preprocess:
    path = found.path / "preprocessor_config.json"
    if not path.is_file():
        return official_preprocess(config.img_size, config.in_chans)
    data = json.loads(path.read_text())
    return Preprocess(img_size=config.img_size,
                      interpolation=_RESAMPLE.get(data.get("resample", 2), "bilinear"),
                      mean=data.get("image_mean", (0.5,) * config.in_chans),
                      std=data.get("image_std", (0.5,) * config.in_chans))
