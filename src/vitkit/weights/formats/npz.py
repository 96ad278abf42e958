"""Official Google `.npz` checkpoints: every published layout read, and written back.

Layouts (names are flattened Flax parameter paths joined by "/"):
- "original": the 2020 release (vit_jax) — `Transformer/encoderblock_N/
  MultiHeadDotProductAttention_1`, `MlpBlock_3`, `LayerNorm_0`/`LayerNorm_2`,
  `Transformer/posembed_input/pos_embedding` (class token's row included), `cls`,
  `pre_logits`, `head`; the hybrid's `conv_root`, `gn_root`, `blockS/unitU/...`.
- "opt_target": the same names under `opt/target/` (checkpoints saved with the optimizer).
- "big_vision": linen names under `params/` — `MultiHeadDotProductAttention_0`, `MlpBlock_0`,
  `LayerNorm_0`/`LayerNorm_1`, and a top-level `pos_embedding` over the patches only (the
  class token is added without a position).
- "scan": big_vision names with the layers stacked on a leading axis under
  `Transformer/encoderblock/`.
The variant (width, depth, heads, MLP, patch, grid, classes, pooling, pre-logits, ResNet
stages) is read from the shapes; outputs match the official JAX model (tanh GELU, LayerNorm
epsilon 1e-6).
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from vitkit.config import ViTConfig, variant_name
from vitkit.errors import CheckpointError, ConfigError
from vitkit.model.resnet import ResNetBackbone
from vitkit.preprocess import official_preprocess
from vitkit.weights.formats.base import ReadOptions, training_image_size
from vitkit.weights.formats.sniff import Found
from vitkit.weights.record import WeightsRecord

log = logging.getLogger("vitkit.weights")

LAYOUTS = ("original", "opt_target", "big_vision", "scan")
_PREFIXES = {"original": "", "opt_target": "opt/target/", "big_vision": "params/",
             "scan": "params/"}


# -- reading files ------------------------------------------------------------------------------
def read_npz(path: str | Path) -> dict[str, np.ndarray]:
    """All arrays of an .npz file, loaded without pickle; clear errors for damaged files."""
    found = Found.at(path)
    if found.kind != "npz":
        raise CheckpointError(f"{found.path} is not an .npz archive of arrays")
    return found.contents()


def is_official_npz(arrays: dict[str, Any]) -> bool:
    return _find_prefix(arrays) is not None


def _find_prefix(arrays: dict[str, Any]) -> str | None:
    for prefix in ("", "opt/target/", "params/"):
        if f"{prefix}embedding/kernel" in arrays:
            return prefix
    return None


# -- official arrays -> vitkit -------------------------------------------------------------------
Shape = tuple[int | None, ...]  # None: any size
_INCOMPLETE = ("the file is incomplete or not a plain ViT checkpoint; download it again or "
               "pass the checkpoint as released")


class _Arrays:
    """An official checkpoint's arrays (names relative to `scope`), handed out checked: a
    missing one names itself and the layout, a wrong shape names the expected and found."""

    def __init__(self, arrays: dict[str, np.ndarray], layout: str, scope: str = "") -> None:
        self.arrays, self.layout, self.scope = arrays, layout, scope

    def __contains__(self, name: str) -> bool:
        return name in self.arrays

    def names(self) -> list[str]:
        return list(self.arrays)

    def get(self, name: str, shape: Shape | None = None) -> np.ndarray:
        if name not in self.arrays:
            raise CheckpointError(f"the tensor {self.scope + name!r} is missing (read as an "
                                  f"official checkpoint in the {self.layout!r} layout): "
                                  f"{_INCOMPLETE}")
        array = self.arrays[name]
        if shape is not None and (array.ndim != len(shape) or any(
                want is not None and want != got
                for want, got in zip(shape, array.shape, strict=True))):
            wanted = ", ".join("*" if want is None else str(want) for want in shape)
            raise CheckpointError(f"the tensor {self.scope + name!r} has shape "
                                  f"{tuple(array.shape)}, expected ({wanted}): {_INCOMPLETE}")
        return array

    def vector(self, name: str, size: int) -> torch.Tensor:
        """A bias or norm parameter of `size` values (stored flat, or (1, 1, 1, C))."""
        array = self.get(name)
        if array.size != size or array.ndim == 0:
            raise CheckpointError(f"the tensor {self.scope + name!r} has shape "
                                  f"{tuple(array.shape)}, expected ({size},): {_INCOMPLETE}")
        return _vector(array)

    def conv(self, name: str) -> torch.Tensor:
        return _conv(self.get(name, (None, None, None, None)))


def _linear(kernel: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(kernel.T))


def _conv(kernel: np.ndarray) -> torch.Tensor:
    """HWIO (Flax) -> OIHW (PyTorch)."""
    return torch.from_numpy(np.ascontiguousarray(kernel.transpose(3, 2, 0, 1)))


def _vector(array: np.ndarray) -> torch.Tensor:
    return torch.from_numpy(np.ascontiguousarray(array.reshape(-1)))


def _block_arrays(w: _Arrays) -> list[_Arrays]:
    """Per-layer arrays, names relative to the layer, unstacking scanned checkpoints."""
    stem = "Transformer/encoderblock/"
    scanned = {k[len(stem):]: v for k, v in w.arrays.items() if k.startswith(stem)}
    if scanned:
        depths = {v.shape[0] if v.ndim else 0 for v in scanned.values()}
        if len(depths) != 1 or 0 in depths:
            raise CheckpointError(f"the stacked encoder arrays ({stem}...) disagree on the "
                                  f"number of layers (leading sizes {sorted(depths)})")
        return [_Arrays({k: v[i] for k, v in scanned.items()}, w.layout,
                        f"{w.scope}{stem}[{i}]/")
                for i in range(depths.pop())]
    layers: dict[int, dict[str, np.ndarray]] = {}
    for key, value in w.arrays.items():
        match = re.match(r"^Transformer/encoderblock_(\d+)/(.+)$", key)
        if match:
            layers.setdefault(int(match.group(1)), {})[match.group(2)] = value
    if not layers:
        raise CheckpointError(f"no encoder blocks (Transformer/encoderblock_N/...) found (read "
                              f"as the {w.layout!r} layout)")
    absent = sorted(set(range(max(layers) + 1)) - set(layers))
    if absent:
        raise CheckpointError(f"encoder block(s) {absent[:8]} are missing: the file has blocks "
                              f"{sorted(layers)[:8]}{' ...' if len(layers) > 8 else ''} (read "
                              f"as the {w.layout!r} layout)")
    return [_Arrays(layers[i], w.layout, f"{w.scope}Transformer/encoderblock_{i}/")
            for i in range(len(layers))]


def _only(names: list[str], what: str, scope: str) -> str:
    if len(names) != 1:
        raise CheckpointError(f"expected one {what} in {scope}, found {names}")
    return names[0]


def _convert_block(index: int, arrays: _Arrays, width: int
                   ) -> tuple[dict[str, torch.Tensor], int, bool]:
    """One encoder block -> vitkit keys; also returns the head count and qkv-bias presence."""
    scopes = sorted({key.split("/")[0] for key in arrays.names()})
    norms = sorted((s for s in scopes if re.fullmatch(r"LayerNorm_\d+", s)),
                   key=lambda s: int(s.split("_")[1]))
    mha = _only([s for s in scopes if s.startswith("MultiHeadDotProductAttention")],
                "attention", arrays.scope)
    mlp = _only([s for s in scopes if s.startswith("MlpBlock")], "MLP", arrays.scope)
    if len(norms) != 2:
        raise CheckpointError(f"expected two LayerNorms in {arrays.scope}, found {norms}")
    p = f"blocks.{index}."
    sd: dict[str, torch.Tensor] = {}
    for name, norm in zip(("norm1", "norm2"), norms, strict=True):
        sd[p + f"{name}.weight"] = arrays.vector(f"{norm}/scale", width)
        sd[p + f"{name}.bias"] = arrays.vector(f"{norm}/bias", width)
    num_heads = arrays.get(f"{mha}/query/kernel", (width, None, None)).shape[1]
    if num_heads < 1 or width % num_heads:
        raise CheckpointError(f"{arrays.scope}{mha}/query/kernel has {num_heads} heads, which "
                              f"do not divide the width {width}")
    head_shape = (num_heads, width // num_heads)
    sd[p + "attn.qkv.weight"] = torch.cat([
        _linear(arrays.get(f"{mha}/{n}/kernel", (width, *head_shape)).reshape(width, -1))
        for n in ("query", "key", "value")])
    qkv_bias = f"{mha}/query/bias" in arrays
    if qkv_bias:
        sd[p + "attn.qkv.bias"] = torch.cat(
            [arrays.vector(f"{mha}/{n}/bias", width) for n in ("query", "key", "value")])
    sd[p + "attn.proj.weight"] = _linear(
        arrays.get(f"{mha}/out/kernel", (*head_shape, width)).reshape(-1, width))
    sd[p + "attn.proj.bias"] = arrays.vector(f"{mha}/out/bias", width)
    mlp_dim = arrays.get(f"{mlp}/Dense_0/kernel", (width, None)).shape[1]
    for r, shape in enumerate(((width, mlp_dim), (mlp_dim, width))):
        sd[p + f"mlp.fc{r + 1}.weight"] = _linear(arrays.get(f"{mlp}/Dense_{r}/kernel", shape))
        sd[p + f"mlp.fc{r + 1}.bias"] = arrays.vector(f"{mlp}/Dense_{r}/bias", shape[1])
    return sd, num_heads, qkv_bias


def _convert_resnet(w: _Arrays) -> tuple[dict[str, torch.Tensor], tuple[int, ...]]:
    """The hybrid's ResNet stem. Kernel shapes are checked when the model is built from
    them (`build_model` names any that do not fit)."""
    root = w.conv("conv_root/kernel")
    sd = {"patch_embed.backbone.stem.conv.weight": root,
          "patch_embed.backbone.stem.norm.weight": w.vector("gn_root/scale", root.shape[0]),
          "patch_embed.backbone.stem.norm.bias": w.vector("gn_root/bias", root.shape[0])}
    layers = []
    stage = 1
    while f"block{stage}/unit1/conv1/kernel" in w:
        unit = 1
        while f"block{stage}/unit{unit}/conv1/kernel" in w:
            src = f"block{stage}/unit{unit}/"
            dst = f"patch_embed.backbone.stages.{stage - 1}.blocks.{unit - 1}."
            for r in (1, 2, 3):
                conv = w.conv(f"{src}conv{r}/kernel")
                sd[dst + f"conv{r}.weight"] = conv
                sd[dst + f"norm{r}.weight"] = w.vector(f"{src}gn{r}/scale", conv.shape[0])
                sd[dst + f"norm{r}.bias"] = w.vector(f"{src}gn{r}/bias", conv.shape[0])
            if f"{src}conv_proj/kernel" in w:
                conv = w.conv(f"{src}conv_proj/kernel")
                sd[dst + "downsample.conv.weight"] = conv
                sd[dst + "downsample.norm.weight"] = w.vector(f"{src}gn_proj/scale",
                                                              conv.shape[0])
                sd[dst + "downsample.norm.bias"] = w.vector(f"{src}gn_proj/bias", conv.shape[0])
            unit += 1
        layers.append(unit - 1)
        stage += 1
    return sd, tuple(layers)


def convert_npz(arrays: dict[str, np.ndarray], img_size: int | tuple[int, int] | None = None,
                target_img_size: int | tuple[int, int] | None = None,
                **overrides: Any) -> tuple[ViTConfig, dict[str, torch.Tensor]]:
    """Config and vitkit state dict from the arrays of an official checkpoint.

    `img_size` is the training resolution; it is read from the position table when the grid
    is square. A non-square grid needs it, or a `target_img_size` (the size the model will be
    built at) whose token count matches the table, which is then taken as the training size.
    Other keyword overrides replace config fields afterwards (`num_classes=` is handled by
    the loader, which resets the head). A missing tensor or a wrong shape is a
    CheckpointError naming the tensor (and the layout, or the expected and found shapes).
    """
    prefix = _find_prefix(arrays)
    if prefix is None:
        raise CheckpointError(
            "not an official ViT checkpoint: no `embedding/kernel` (with or without an "
            "`opt/target/` or `params/` prefix)")
    w = _Arrays({k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)},
                layout_of(arrays), prefix)
    if any(k.startswith("MAPHead") for k in w.names()):
        raise CheckpointError("this checkpoint uses a MAP (attention-pooling) head, which "
                                    "the paper's ViT does not have")
    sd: dict[str, torch.Tensor] = {}
    fields: dict[str, Any] = {}
    embedding = w.get("embedding/kernel", (None, None, None, None))  # (P, P, C, D)
    kernel, width = embedding.shape[0], embedding.shape[3]
    if embedding.shape[1] != kernel or min(embedding.shape) < 1:
        raise CheckpointError(f"the tensor '{prefix}embedding/kernel' has shape "
                              f"{embedding.shape}, expected (P, P, channels, width) with square "
                              "non-empty patches")
    if "conv_root/kernel" in w:
        resnet_sd, layers = _convert_resnet(w)
        sd.update(resnet_sd)
        root = w.get("conv_root/kernel")
        fields.update(stem="resnet", resnet_layers=layers, resnet_width=root.shape[3],
                      in_chans=root.shape[2])
        patch = kernel * ResNetBackbone.total_stride(layers)
    else:
        fields["in_chans"] = embedding.shape[2]
        patch = kernel
    sd["patch_embed.proj.weight"] = _conv(embedding)
    sd["patch_embed.proj.bias"] = w.vector("embedding/bias", width)

    class_token = "cls" in w
    if class_token:
        sd["cls_token"] = torch.from_numpy(np.ascontiguousarray(w.get("cls", (1, 1, width))))
    if "Transformer/posembed_input/pos_embedding" in w:  # original: class token row included
        pos = w.get("Transformer/posembed_input/pos_embedding", (1, None, width))
        num_patches = pos.shape[1] - int(class_token)
    elif "pos_embedding" in w:  # big_vision: patches only; the class token has no position
        pos = w.get("pos_embedding", (1, None, width))
        num_patches = pos.shape[1]
        if class_token:
            pos = np.concatenate([np.zeros((1, 1, width), pos.dtype), pos], axis=1)
    else:
        raise CheckpointError(f"no position embeddings ('{prefix}pos_embedding' or "
                              f"'{prefix}Transformer/posembed_input/pos_embedding') in the "
                              f"checkpoint (read as the {w.layout!r} layout)")
    if num_patches < 1:
        raise CheckpointError(f"the position embeddings have shape {pos.shape}: no rows for "
                              "the patches")
    sd["pos_embed"] = torch.from_numpy(np.ascontiguousarray(pos))
    img_size = training_image_size(num_patches, patch, img_size, target_img_size)

    depth = 0
    heads = qkv_bias = None
    for index, block in enumerate(_block_arrays(w)):
        block_sd, heads, qkv_bias = _convert_block(index, block, width)
        sd.update(block_sd)
        depth += 1
    if "Transformer/encoder_norm/scale" in w:
        sd["norm.weight"] = w.vector("Transformer/encoder_norm/scale", width)
        sd["norm.bias"] = w.vector("Transformer/encoder_norm/bias", width)
    pre_logits_dim = 0
    if "pre_logits/kernel" in w:
        pre_logits_dim = w.get("pre_logits/kernel", (width, None)).shape[1]
        sd["pre_logits.fc.weight"] = _linear(w.get("pre_logits/kernel"))
        sd["pre_logits.fc.bias"] = w.vector("pre_logits/bias", pre_logits_dim)
    num_classes = 0
    if "head/kernel" in w and w.get("head/kernel").shape[-1:] != (0,):
        head = w.get("head/kernel", (pre_logits_dim or width, None))
        num_classes = head.shape[1]
        sd["head.weight"] = _linear(head)
        sd["head.bias"] = w.vector("head/bias", num_classes)
    config = ViTConfig(
        img_size=img_size, patch_size=patch, num_classes=num_classes, width=width, depth=depth,
        num_heads=heads, mlp_dim=sd["blocks.0.mlp.fc1.weight"].shape[0], qkv_bias=qkv_bias,
        class_token=class_token, pool="class_token" if class_token else "mean_patches",
        final_norm="tokens" if "norm.weight" in sd else "none", pre_logits_dim=pre_logits_dim,
        act="gelu_tanh", norm_eps=1e-6, init="jax", **fields)
    config = config.replace(name=variant_name(config))
    if overrides:
        config = config.replace(**overrides)
    return config, {k: v.float() for k, v in sd.items()}


# -- vitkit -> official arrays ------------------------------------------------------------------
def _np(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().float().cpu().numpy()


def _hwio(tensor: torch.Tensor) -> np.ndarray:
    return _np(tensor).transpose(2, 3, 1, 0)


def _block_to_flax(sd: dict[str, torch.Tensor], index: int, config: ViTConfig,
                   linen: bool) -> dict[str, np.ndarray]:
    p = f"blocks.{index}."
    width, heads, head_dim = config.width, config.num_heads, config.head_dim
    mha, mlp, ln2 = ("MultiHeadDotProductAttention_0", "MlpBlock_0", "LayerNorm_1") if linen \
        else ("MultiHeadDotProductAttention_1", "MlpBlock_3", "LayerNorm_2")
    out = {"LayerNorm_0/scale": _np(sd[p + "norm1.weight"]),
           "LayerNorm_0/bias": _np(sd[p + "norm1.bias"]),
           f"{ln2}/scale": _np(sd[p + "norm2.weight"]), f"{ln2}/bias": _np(sd[p + "norm2.bias"])}
    qkv_w = _np(sd[p + "attn.qkv.weight"]).reshape(3, width, width)
    qkv_b = _np(sd[p + "attn.qkv.bias"]).reshape(3, heads, head_dim) \
        if p + "attn.qkv.bias" in sd else None
    for i, name in enumerate(("query", "key", "value")):
        out[f"{mha}/{name}/kernel"] = qkv_w[i].T.reshape(width, heads, head_dim)
        if qkv_b is not None:
            out[f"{mha}/{name}/bias"] = qkv_b[i]
    out[f"{mha}/out/kernel"] = _np(sd[p + "attn.proj.weight"]).T.reshape(heads, head_dim, width)
    out[f"{mha}/out/bias"] = _np(sd[p + "attn.proj.bias"])
    for r in range(2):
        out[f"{mlp}/Dense_{r}/kernel"] = _np(sd[p + f"mlp.fc{r + 1}.weight"]).T
        out[f"{mlp}/Dense_{r}/bias"] = _np(sd[p + f"mlp.fc{r + 1}.bias"])
    return out


def _resnet_to_flax(sd: dict[str, torch.Tensor], config: ViTConfig) -> dict[str, np.ndarray]:
    def gn(tensor: torch.Tensor) -> np.ndarray:
        return _np(tensor).reshape(1, 1, 1, -1)  # as the released files store GroupNorm params

    base = "patch_embed.backbone."
    out = {"conv_root/kernel": _hwio(sd[base + "stem.conv.weight"]),
           "gn_root/scale": gn(sd[base + "stem.norm.weight"]),
           "gn_root/bias": gn(sd[base + "stem.norm.bias"])}
    for s, units in enumerate(config.resnet_layers):
        for u in range(units):
            src, dst = f"{base}stages.{s}.blocks.{u}.", f"block{s + 1}/unit{u + 1}/"
            for r in (1, 2, 3):
                out[f"{dst}conv{r}/kernel"] = _hwio(sd[f"{src}conv{r}.weight"])
                out[f"{dst}gn{r}/scale"] = gn(sd[f"{src}norm{r}.weight"])
                out[f"{dst}gn{r}/bias"] = gn(sd[f"{src}norm{r}.bias"])
            if f"{src}downsample.conv.weight" in sd:
                out[f"{dst}conv_proj/kernel"] = _hwio(sd[f"{src}downsample.conv.weight"])
                out[f"{dst}gn_proj/scale"] = gn(sd[f"{src}downsample.norm.weight"])
                out[f"{dst}gn_proj/bias"] = gn(sd[f"{src}downsample.norm.bias"])
    return out


def to_official_arrays(model: torch.nn.Module, layout: str = "original") -> dict[str, np.ndarray]:
    """The model's weights as the arrays of an official checkpoint in `layout`."""
    if layout not in LAYOUTS:
        raise ConfigError(f"layout={layout!r} is not one of {', '.join(LAYOUTS)}")
    config: ViTConfig = model.config
    if config.pos_embed != "learned" or config.stem == "conv" or config.final_norm == "pooled" \
            or config.pool == "mean_all_tokens":
        raise ConfigError("only the paper's ViT (learned positions, patch or ResNet stem, "
                          "class-token or GAP head) has an official layout")
    sd = model.state_dict()
    linen = layout in ("big_vision", "scan")
    w: dict[str, np.ndarray] = {}
    if config.stem == "resnet":
        w.update(_resnet_to_flax(sd, config))
    w["embedding/kernel"] = _hwio(sd["patch_embed.proj.weight"])
    w["embedding/bias"] = _np(sd["patch_embed.proj.bias"])
    pos = _np(sd["pos_embed"])
    cls = _np(sd["cls_token"]) if config.class_token else None
    if linen:
        if cls is not None:  # the class token takes no position in big_vision: fold it in
            cls, pos = cls + pos[:, :1], pos[:, 1:]
        w["pos_embedding"] = pos
    else:
        w["Transformer/posembed_input/pos_embedding"] = pos
    if cls is not None:
        w["cls"] = cls
    blocks = [_block_to_flax(sd, i, config, linen) for i in range(config.depth)]
    if layout == "scan":
        for name in blocks[0]:
            w[f"Transformer/encoderblock/{name}"] = np.stack([b[name] for b in blocks])
    else:
        for i, block in enumerate(blocks):
            w.update({f"Transformer/encoderblock_{i}/{k}": v for k, v in block.items()})
    if "norm.weight" in sd:
        w["Transformer/encoder_norm/scale"] = _np(sd["norm.weight"])
        w["Transformer/encoder_norm/bias"] = _np(sd["norm.bias"])
    if config.pre_logits_dim:
        w["pre_logits/kernel"] = _np(sd["pre_logits.fc.weight"]).T
        w["pre_logits/bias"] = _np(sd["pre_logits.fc.bias"])
    if config.num_classes:
        w["head/kernel"] = _np(sd["head.weight"]).T
        w["head/bias"] = _np(sd["head.bias"])
    prefix = _PREFIXES[layout]
    return {prefix + k: np.ascontiguousarray(v, dtype=np.float32) for k, v in w.items()}


def save_npz(model: torch.nn.Module, path: str | Path, layout: str = "original") -> Path:
    """Write the model as an official `.npz` checkpoint (loadable by the JAX code and timm).
    A hybrid read from timm's files (`resnet_norm="timm"`) is warned of: the format holds no
    such setting, so the file is read back with the official constants."""
    path = Path(path)
    if getattr(getattr(model, "config", None), "resnet_norm", "official") == "timm":
        log.warning("warning: %s: this hybrid normalises with timm's constants (it was read "
                    "from timm's files), which an official .npz cannot record: read back, it "
                    "uses the official ones and its outputs move (by about 1e-3); "
                    "save_pretrained keeps the setting", path)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, **to_official_arrays(model, layout))
    return path


# -- the adapter -------------------------------------------------------------------------------
def layout_of(arrays: dict[str, Any]) -> str:
    """Which of LAYOUTS an official checkpoint's arrays follow."""
    prefix = _find_prefix(arrays)
    if prefix == "opt/target/":
        return "opt_target"
    if prefix == "params/":
        return "scan" if any(k.startswith("params/Transformer/encoderblock/") for k in arrays) \
            else "big_vision"
    return "original"


def detect(found: Found) -> bool:
    return found.kind == "npz"


def read(found: Found, options: ReadOptions) -> WeightsRecord:
    arrays = found.contents()
    if not is_official_npz(arrays):
        raise CheckpointError(f"{found.path} is an .npz archive but not an official ViT "
                              "checkpoint (no embedding/kernel)")
    try:
        config, state_dict = convert_npz(arrays, img_size=options.source_img_size,
                                         target_img_size=options.img_size)
    except (CheckpointError, ConfigError) as exc:
        raise CheckpointError(f"{found.path} cannot be read as an official ViT checkpoint: "
                              f"{exc}") from None
    return WeightsRecord(config, state_dict, official_preprocess(config.img_size, config.in_chans),
                         "npz", extra={"layout": layout_of(arrays)}, path=found.path)


# The writer: official arrays in any of LAYOUTS.
write = save_npz
