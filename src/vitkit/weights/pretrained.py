"""`load_pretrained`: any ViT weights file, folder or checkpoint name, recognised by content.

Recognised: official Google .npz (every layout, see `weights.npz`), vitkit's own format (a
folder with model.safetensors + config.json holding the model config and preprocessing),
vitkit training checkpoints (last.pt/best.pt), timm and Hugging Face state dicts
(.safetensors, or .bin/.pth read with `torch.load(weights_only=True)`), Hugging Face model
folders (config.json + weights), and named official checkpoints ("B/16-i21k").
"""

from __future__ import annotations

import json
import logging
import pickle
import struct
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

from vitkit.config import HEADS_BY_WIDTH, ViTConfig
from vitkit.data.preprocess import (
    IMAGENET_MEAN,
    IMAGENET_STD,
    Preprocess,
    official_preprocess,
    preprocess_for,
)
from vitkit.errors import ConfigError
from vitkit.model.vit import VisionTransformer
from vitkit.weights.hf import convert_hf
from vitkit.weights.hub import resolve_named
from vitkit.weights.loading import load_state_dict_checked
from vitkit.weights.npz import CheckpointFormatError, convert_npz, is_official_npz, read_npz
from vitkit.weights.timm import convert_timm

log = logging.getLogger(__name__)

FORMAT_NAME = "vitkit"
FORMAT_VERSION = 1
WEIGHTS_FILE = "model.safetensors"
CONFIG_FILE = "config.json"
# Overrides that change the loaded model rather than its config fields.
_SHAPE_OVERRIDES = ("num_classes", "img_size")


@dataclass
class LoadedWeights:
    """A checkpoint read and converted, before a model is built from it."""

    config: ViTConfig
    state_dict: dict[str, torch.Tensor]
    preprocess: Preprocess
    origin: str  # "npz/original", "timm", "huggingface", "vitkit", "vitkit-train", ...
    class_names: list[str] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


# -- sniffing -------------------------------------------------------------------------------------
def _file_kind(path: Path) -> str:
    """"html", "npz", "torch-zip", "safetensors", "pickle" or "unknown", from the bytes."""
    with path.open("rb") as stream:
        head = stream.read(16)
    if not head:
        raise CheckpointFormatError(f"{path} is empty: download it again")
    if head.lstrip().lower().startswith((b"<!doctype", b"<html", b"<?xml", b"<head", b"<body")):
        return "html"
    if head.startswith(b"PK"):
        try:
            with zipfile.ZipFile(path) as archive:
                names = archive.namelist()
        except zipfile.BadZipFile as exc:
            raise CheckpointFormatError(
                f"{path} is a damaged or truncated archive ({exc}): download it again") from exc
        if names and all(name.endswith(".npy") for name in names):
            return "npz"
        if any(name.endswith("data.pkl") for name in names):
            return "torch-zip"
        return "unknown"
    if len(head) >= 9:
        (header_len,) = struct.unpack("<Q", head[:8])
        if head[8:9] == b"{" and header_len < path.stat().st_size:
            return "safetensors"
    if head[:1] == b"\x80":
        return "pickle"
    return "unknown"


def _html_error(path: Path) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"{path} is an HTML page, not a checkpoint: the download returned a web page (a login, "
        "quota or error page). Download the file again from its direct URL.")


def _torch_load(path: Path) -> Any:
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as exc:
        raise CheckpointFormatError(
            f"refused to load {path}: it is a pickle that needs to run code or build objects "
            f"beyond tensors and plain containers, and vitkit only loads with "
            f"torch.load(weights_only=True). If you trust the file, re-save its state dict "
            f"(torch.save(model.state_dict(), ...)) or convert it to safetensors. ({exc})"
        ) from exc
    except (RuntimeError, EOFError, OSError, zipfile.BadZipFile) as exc:
        raise CheckpointFormatError(
            f"cannot read {path} as a PyTorch file ({exc}): it may be truncated; download it "
            "again") from exc


def _read_safetensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError) as exc:
        raise CheckpointFormatError(
            f"cannot read {path} as safetensors ({exc}): it may be truncated; download it "
            "again") from exc


# -- state dict families --------------------------------------------------------------------------
def _unwrap(obj: Any) -> dict[str, torch.Tensor]:
    if isinstance(obj, dict):
        for key in ("state_dict", "model", "module", "model_state"):
            if key in obj and isinstance(obj[key], dict) and not isinstance(obj[key], torch.Tensor):
                return _unwrap(obj[key])
        tensors = {k: v for k, v in obj.items() if isinstance(v, torch.Tensor)}
        if tensors:
            return {k.removeprefix("module."): v for k, v in tensors.items()}
    raise CheckpointFormatError("the file holds no tensors that look like model weights")


def _is_hf(sd: dict[str, torch.Tensor]) -> bool:
    return any(k.removeprefix("vit.").startswith(("embeddings.", "encoder.layer.", "layers."))
               for k in sd)


def _hf_config_from_shapes(sd: dict[str, torch.Tensor]) -> dict[str, Any]:
    """A Hugging Face config for a loose HF state dict (no config.json): HF's defaults."""
    proj = next(v for k, v in sd.items() if k.endswith("patch_embeddings.projection.weight"))
    pos = next(v for k, v in sd.items() if k.endswith("position_embeddings"))
    fc1 = next(v for k, v in sd.items() if k.endswith(("intermediate.dense.weight",
                                                       "mlp.fc1.weight")))
    layers = {k.split(".")[2 if k.startswith("vit.") else 1] for k in sd
              if ".layer." in k or k.removeprefix("vit.").startswith("layers.")}
    width = proj.shape[0]
    side = round((pos.shape[1] - 1) ** 0.5)
    head = next((v for k, v in sd.items() if k == "classifier.weight"), None)
    if width not in HEADS_BY_WIDTH:
        raise CheckpointFormatError(f"width {width} is not a standard ViT width; pass the "
                                    "model folder with its config.json")
    return {"hidden_size": width, "num_hidden_layers": len(layers), "patch_size": proj.shape[2],
            "num_channels": proj.shape[1], "image_size": side * proj.shape[2],
            "intermediate_size": fc1.shape[0], "num_attention_heads": HEADS_BY_WIDTH[width],
            "num_labels": head.shape[0] if head is not None else 2,
            "qkv_bias": any(k.endswith(("query.bias", "q_proj.bias")) for k in sd)}


def _from_state_dict(sd: dict[str, torch.Tensor], path: Path, hf_config: Any = None,
                     timm_cfg: dict[str, Any] | None = None) -> LoadedWeights:
    if _is_hf(sd):
        hf_config = hf_config or _hf_config_from_shapes(sd)
        config, converted = convert_hf(sd, hf_config)
        return LoadedWeights(config, converted, Preprocess(img_size=config.img_size),
                             "huggingface", _hf_labels(hf_config))
    if "patch_embed.proj.weight" in sd:
        config, converted = convert_timm(sd, **(timm_cfg or {}))
        pre = Preprocess(img_size=config.img_size)
        log.info("%s: timm weights without a pretrained config; assuming mean=std=0.5 "
                 "(the official and augreg ViTs)", path)
        return LoadedWeights(config, converted, pre, "timm")
    raise CheckpointFormatError(
        f"{path} holds tensors but not a ViT state dict vitkit knows (timm's "
        f"'patch_embed.proj.weight', Hugging Face's 'embeddings.…'); first keys: "
        f"{', '.join(list(sd)[:5])}")


def _hf_labels(hf_config: Any) -> list[str] | None:
    labels = hf_config.get("id2label") if isinstance(hf_config, dict) else \
        getattr(hf_config, "id2label", None)
    if not labels or all(str(v).startswith("LABEL_") for v in labels.values()):
        return None
    return [labels[k] for k in sorted(labels, key=int)]


def _from_vitkit_train(state: dict[str, Any]) -> LoadedWeights:
    config = ViTConfig.from_dict(state["model_config"])
    pre = state.get("preprocess") or {}
    preprocess = Preprocess(img_size=config.img_size, interpolation="bicubic",
                            mean=pre.get("mean", (0.5,) * config.in_chans),
                            std=pre.get("std", (0.5,) * config.in_chans))
    return LoadedWeights(config, state["model"], preprocess, "vitkit-train",
                         list(state.get("classes") or []) or None,
                         extra={"train_config": state.get("train_config")})


# -- folders --------------------------------------------------------------------------------------
def _read_folder(folder: Path) -> LoadedWeights:
    config_path = folder / CONFIG_FILE
    if not config_path.is_file():
        raise CheckpointFormatError(f"{folder} has no {CONFIG_FILE}: it is not a vitkit or "
                                    "Hugging Face model folder")
    meta = json.loads(config_path.read_text())
    weights = next((folder / n for n in (WEIGHTS_FILE, "pytorch_model.bin")
                    if (folder / n).is_file()), None)
    if weights is None:
        raise CheckpointFormatError(f"{folder} has no {WEIGHTS_FILE} or pytorch_model.bin")
    sd = _read_safetensors(weights) if weights.suffix == ".safetensors" else \
        _unwrap(_torch_load(weights))
    if meta.get("format") == FORMAT_NAME:
        config = ViTConfig.from_dict(meta["model"])
        pre = Preprocess.from_dict(meta["preprocess"]) if meta.get("preprocess") else \
            Preprocess(img_size=config.img_size)
        return LoadedWeights(config, sd, pre, "vitkit", meta.get("class_names"))
    if meta.get("model_type") in ("vit", "vit-hybrid") or _is_hf(sd):
        loaded = _from_state_dict(sd, weights, hf_config=meta)
        loaded.preprocess = _hf_preprocess(folder, loaded.config)
        return loaded
    if "pretrained_cfg" in meta or "architecture" in meta:  # a timm Hub folder
        loaded = _from_state_dict(sd, weights)
        cfg = meta.get("pretrained_cfg", {})
        loaded.preprocess = Preprocess(
            img_size=loaded.config.img_size, resize_mode="shorter_side",
            crop_pct=cfg.get("crop_pct", 1.0), interpolation=cfg.get("interpolation", "bicubic"),
            mean=cfg.get("mean", IMAGENET_MEAN), std=cfg.get("std", IMAGENET_STD))
        return loaded
    raise CheckpointFormatError(f"{config_path} is neither a vitkit nor a Hugging Face ViT config")


def _hf_preprocess(folder: Path, config: ViTConfig) -> Preprocess:
    path = folder / "preprocessor_config.json"
    if not path.is_file():
        return Preprocess(img_size=config.img_size)
    data = json.loads(path.read_text())
    resample = {0: "nearest", 2: "bilinear", 3: "bicubic", 1: "lanczos"}
    return Preprocess(img_size=config.img_size,
                      interpolation=resample.get(data.get("resample", 2), "bilinear"),
                      mean=data.get("image_mean", (0.5,) * config.in_chans),
                      std=data.get("image_std", (0.5,) * config.in_chans))


# -- entry points ---------------------------------------------------------------------------------
def _timm_hints(hints: dict[str, Any], img_size: Any) -> dict[str, Any]:
    return {**hints, **({"img_size": img_size} if img_size is not None else {})}


def read_weights(source: str | Path, weights_dir: str | Path | None = None,
                 download: bool | None = None, source_img_size: Any = None,
                 **timm_hints: Any) -> LoadedWeights:
    """Read and convert a checkpoint (file, folder or name) without building a model.

    `source_img_size` is only needed for a file trained at a non-square resolution;
    `timm_hints` (num_heads, global_pool) for timm state dicts whose shapes leave them open.
    """
    path = Path(source)
    if not path.exists():
        path = resolve_named(str(source), weights_dir, download)
    if path.is_dir():
        return _read_folder(path)
    kind = _file_kind(path)
    if kind == "html":
        raise _html_error(path)
    if kind == "npz":
        arrays = read_npz(path)
        if not is_official_npz(arrays):
            raise CheckpointFormatError(f"{path} is an .npz archive but not an official ViT "
                                        "checkpoint (no embedding/kernel)")
        config, sd = convert_npz(arrays, img_size=source_img_size)
        return LoadedWeights(config, sd, official_preprocess(config.img_size, config.in_chans),
                             "npz")
    if kind == "safetensors":
        sidecar = path.with_name(CONFIG_FILE)
        if sidecar.is_file() and json.loads(sidecar.read_text()).get("format") == FORMAT_NAME:
            return _read_folder(path.parent)
        return _from_state_dict(_read_safetensors(path), path,
                                timm_cfg=_timm_hints(timm_hints, source_img_size))
    if kind in ("torch-zip", "pickle"):
        obj = _torch_load(path)
        if isinstance(obj, dict) and "model_config" in obj and "model" in obj:
            return _from_vitkit_train(obj)
        return _from_state_dict(_unwrap(obj), path,
                                timm_cfg=_timm_hints(timm_hints, source_img_size))
    raise CheckpointFormatError(
        f"{path} is not a checkpoint format vitkit reads: expected an official .npz, "
        ".safetensors, a PyTorch .bin/.pth/.pt, or a model folder")


def build_model(weights: LoadedWeights, pos_interpolation: str = "bilinear",
                **overrides: Any) -> VisionTransformer:
    """Build the model, load the weights strictly, then apply `img_size` / `num_classes`.

    A new `img_size` resamples the position embeddings (`pos_interpolation`: "bilinear" as
    the official code, or "bicubic"); a new `num_classes` resets the head to zeros and drops
    the pre-logits layer, as the paper's fine-tuning does. Other overrides (dropout,
    drop_path, ...) must not change parameter shapes.
    """
    reshape = {k: overrides.pop(k) for k in _SHAPE_OVERRIDES if k in overrides}
    config = weights.config.replace(**overrides) if overrides else weights.config
    with torch.device("meta"):
        model = VisionTransformer(config)
    model.to_empty(device="cpu")
    if config.pos_embed in ("sincos1d", "sincos2d"):  # non-persistent buffers: rebuild
        model.pos_embed = torch.nn.Buffer(VisionTransformer._make_pos_embed(config),
                                          persistent=False)
    try:
        load_state_dict_checked(model, weights.state_dict)
    except ConfigError as exc:
        raise CheckpointFormatError(
            f"the {weights.origin} weights do not fit the ViT their shapes describe "
            f"({config.name or 'custom'}): the file is inconsistent or not a plain ViT.\n{exc}"
        ) from exc
    preprocess = weights.preprocess
    if reshape.get("img_size") is not None:
        model.set_image_size(reshape["img_size"], mode=pos_interpolation)
        preprocess = preprocess.replace(img_size=list(model.config.img_size))
    class_names = weights.class_names
    num_classes = reshape.get("num_classes")
    if num_classes is not None and num_classes != config.num_classes:
        model.reset_classifier(num_classes, zero_init=True)
        class_names = None
    model.preprocess = preprocess
    model.class_names = class_names
    model.origin = weights.origin
    return model.eval()


def load_pretrained(source: str | Path, *, weights_dir: str | Path | None = None,
                    download: bool | None = None, pos_interpolation: str = "bilinear",
                    source_img_size: int | tuple[int, int] | None = None,
                    **overrides: Any) -> VisionTransformer:
    """A ViT with weights from a file, folder or checkpoint name, in eval mode.

    >>> model = load_pretrained("B/16-i21k", img_size=384, num_classes=10)

    The model carries `model.preprocess` (what its inputs must look like) and
    `model.class_names` (when the checkpoint names its classes). `source_img_size` is the
    training resolution of a file with a non-square position grid; `num_heads` and
    `global_pool` complete timm state dicts of non-standard widths.
    """
    hints = {k: overrides.pop(k) for k in ("num_heads", "global_pool") if k in overrides}
    weights = read_weights(source, weights_dir, download, source_img_size, **hints)
    return build_model(weights, pos_interpolation, **overrides)


def load_weights(model: VisionTransformer, source: str | Path, **read_options: Any) -> None:
    """Load a checkpoint into an existing model, strictly, with errors that name the fix."""
    weights = read_weights(source, **read_options)
    try:
        load_state_dict_checked(model, weights.state_dict)
    except ConfigError as exc:
        raise CheckpointFormatError(f"{source} does not fit this model: {exc}") from exc


def save_pretrained(model: VisionTransformer, directory: str | Path,
                    preprocess: Preprocess | None = None,
                    class_names: list[str] | None = None) -> Path:
    """Write vitkit's format: model.safetensors + config.json (config, preprocessing, classes)."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    preprocess = preprocess or preprocess_for(model)
    class_names = class_names if class_names is not None else getattr(model, "class_names", None)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, directory / WEIGHTS_FILE, metadata={"format": FORMAT_NAME})
    meta = {"format": FORMAT_NAME, "version": FORMAT_VERSION, "model": model.config.to_dict(),
            "preprocess": preprocess.to_dict(), "class_names": class_names}
    (directory / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n")
    return directory
