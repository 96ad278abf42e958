"""`ViTConfig`: every option of the model as plain data, and variant names parsed into configs.

Variants are parsed, not enumerated: "B/16" is width, depth, MLP size and heads of ViT-Base
(paper Table 1) with 16x16 patches; any size letter combines with any patch size.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from vitkit.errors import ConfigError
from vitkit.fieldtypes import (
    ImageSize,
    check_fields,
    check_known_keys,
    closest_path,
    did_you_mean,
)
from vitkit.files import check_json_size, parse_json

POOLS = ("class_token", "mean_patches", "mean_all_tokens")
# timm's `global_pool` names and the pool each is (timm's "avg" leaves the prefix tokens
# out); timm's "", "max", "avgmax", "map" and "prr" have no counterpart here.
TIMM_POOLS = {"token": "class_token", "avg": "mean_patches"}
FINAL_NORMS = ("tokens", "pooled", "none")
POS_EMBEDS = ("learned", "sincos1d", "sincos2d", "none")
STEMS = ("patch", "conv", "resnet")
RESNET_NORMS = ("official", "timm")  # `vitkit.model.resnet.NORM_CONVENTIONS`
ACTIVATIONS = ("gelu", "gelu_tanh")
INIT_SCHEMES = ("jax", "trunc_normal")


@dataclass(frozen=True)
class SizeSpec:
    """One row of the paper's Table 1 (Ti and S are the widely used smaller widths)."""

    name: str
    width: int
    depth: int
    mlp_dim: int
    num_heads: int


SIZES: dict[str, SizeSpec] = {
    "Ti": SizeSpec("Tiny", 192, 12, 768, 3),
    "S": SizeSpec("Small", 384, 12, 1536, 6),
    "B": SizeSpec("Base", 768, 12, 3072, 12),
    "L": SizeSpec("Large", 1024, 24, 4096, 16),
    "H": SizeSpec("Huge", 1280, 32, 5120, 16),
}
_SIZE_ALIASES = {"ti": "Ti", "tiny": "Ti", "s": "S", "small": "S", "b": "B", "base": "B",
                 "l": "L", "large": "L", "h": "H", "huge": "H"}
HEADS_BY_WIDTH = {spec.width: spec.num_heads for spec in SIZES.values()}

# Names listed by `vitkit models`; any other size/patch combination parses too.
COMMON_VARIANTS = ("Ti/16", "S/16", "S/32", "B/8", "B/16", "B/32", "L/14", "L/16", "L/32", "H/14",
                   "R50+B/16", "R50+L/32", "R26+B/32", "R+Ti/32")


# timm's and Hugging Face's names of config fields, and what they are here (a key refused
# as unknown names its field rather than the closest spelling: "embed_dim" is not "mlp_dim").
PEER_NAMES = {
    "embed_dim": "width", "hidden_size": "width", "num_hidden_layers": "depth",
    "num_attention_heads": "num_heads", "intermediate_size": "mlp_dim",
    "mlp_ratio": "mlp_dim (mlp_ratio x width: mlp_dim=3072 for width 768 and ratio 4)",
    "image_size": "img_size", "num_channels": "in_chans", "in_channels": "in_chans",
    "drop_rate": "dropout", "hidden_dropout_prob": "dropout", "proj_drop_rate": "dropout",
    "attn_drop_rate": "attn_dropout", "attention_probs_dropout_prob": "attn_dropout",
    "drop_path_rate": "drop_path", "layer_norm_eps": "norm_eps", "hidden_act": "act",
    "global_pool": "pool ('class_token' for timm's 'token', 'mean_patches' for 'avg')",
    "representation_size": "pre_logits_dim",
    "pretrained": "load_pretrained(NAME), which reads the weights (create_model builds the "
                  "architecture at random)",
}


@dataclass
class ViTConfig:
    """Everything that defines a Vision Transformer; round-trips through JSON.

    Field names follow the paper: `width` is the hidden size D, `mlp_dim` the MLP size,
    `depth` the number of layers L. `num_classes=0` builds a features-only model.
    """

    img_size: ImageSize = (224, 224)  # (height, width); 224 and "60x100" are read as sizes
    dynamic_img_size: bool = False  # forward takes any size the stem tokenises (see the model)
    patch_size: int = 16
    in_chans: int = 3
    stem: str = "patch"  # "patch": one P x P projection; "conv": a small CNN (hybrid)
    stem_channels: tuple[int, ...] = ()  # conv stem: 3x3 conv widths, the last log2(P) stride 2
    stem_strides: tuple[int, ...] = ()  # conv stem: each conv's stride (1 or 2); () = as above
    stem_pool: bool = False  # conv stem: halve by 2x2 max-pooling after the conv, not a stride
    resnet_layers: tuple[int, ...] = ()  # resnet stem: units per stage, (3, 4, 9) for R50
    resnet_width: int = 64  # resnet stem: root width (x 2 per stage, x 4 in the bottlenecks)
    resnet_norm: str = "official"  # resnet stem: normalisation constants, "official" or "timm"
    num_classes: int = 1000
    width: int = 768
    depth: int = 12
    num_heads: int = 12
    mlp_dim: int = 3072
    qkv_bias: bool = True
    class_token: bool = True
    pool: str = "class_token"
    final_norm: str = "tokens"
    pos_embed: str = "learned"
    pre_logits_dim: int = 0
    act: str = "gelu"
    norm_eps: float = 1e-6
    dropout: float = 0.0
    attn_dropout: float = 0.0
    drop_path: float = 0.0
    init: str = "jax"
    name: str = field(default="", compare=False)

    def __post_init__(self) -> None:
        check_fields(self)  # each value has its field's type: depth=4, qkv_bias=False, ...
        self._validate()

    # -- derived sizes -------------------------------------------------------------------
    @property
    def grid_size(self) -> tuple[int, int]:
        """Patches along height and width."""
        return (self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size)

    @property
    def num_patches(self) -> int:
        return self.grid_size[0] * self.grid_size[1]

    @property
    def num_prefix_tokens(self) -> int:
        return 1 if self.class_token else 0

    @property
    def seq_len(self) -> int:
        return self.num_patches + self.num_prefix_tokens

    @property
    def head_dim(self) -> int:
        return self.width // self.num_heads

    # -- checks ----------------------------------------------------------------------------
    def _validate(self) -> None:
        for key, allowed in (("pool", POOLS), ("final_norm", FINAL_NORMS), ("stem", STEMS),
                             ("pos_embed", POS_EMBEDS), ("act", ACTIVATIONS),
                             ("init", INIT_SCHEMES), ("resnet_norm", RESNET_NORMS)):
            value = getattr(self, key)
            if value not in allowed:
                raise ConfigError(f"{key}={value!r} is not one of {', '.join(allowed)}"
                                  + did_you_mean(str(value), allowed))
        for key in ("patch_size", "in_chans", "width", "depth", "num_heads", "mlp_dim"):
            if int(getattr(self, key)) < 1:
                raise ConfigError(f"{key} must be a positive integer, got {getattr(self, key)}")
        if self.num_classes < 0 or self.pre_logits_dim < 0:
            raise ConfigError("num_classes and pre_logits_dim must be >= 0 (0 means none)")
        if self.width % self.num_heads:
            divisors = [h for h in range(max(1, self.num_heads - 64), self.num_heads + 65)
                        if self.width % h == 0]  # those near num_heads (widths can be huge)
            near = sorted(sorted(divisors, key=lambda h: abs(h - self.num_heads))[:4])
            raise ConfigError(
                f"width {self.width} is not divisible by num_heads {self.num_heads}: each head "
                f"gets width / num_heads channels. Use num_heads in {near} or change width.")
        height, width = self.img_size
        patch = self.patch_size
        if min(height, width) < patch:
            raise ConfigError(
                f"image size {height}x{width} is smaller than the patch size {patch}: each "
                f"token is a {patch}x{patch} patch. Use an image size of at least "
                f"{patch}x{patch} (a multiple of {patch}) or a smaller patch_size.")
        if height % patch or width % patch:
            near = f"{_nearest_multiple(height, patch)}x{_nearest_multiple(width, patch)}"
            raise ConfigError(
                f"image size {height}x{width} is not divisible by patch size {patch}: use an "
                f"image size that is a multiple of {patch} (e.g. {near}) or a patch size that "
                f"divides both sides "
                f"({patch_sizes_in_words(height, width, self.stem_takes_patch)}).")
        if self.stem == "conv":
            self._validate_conv_stem()
        elif self.stem_pool:
            raise ConfigError(f"stem_pool=True pools inside a conv stem; this model's stem is "
                              f"{self.stem!r}: set stem='conv' with stem_channels, or drop "
                              "stem_pool")
        if self.stem == "resnet":
            stride = 4 * 2 ** max(len(self.resnet_layers) - 1, 0)
            if self.patch_size % stride:
                raise ConfigError(
                    f"stem='resnet' with {len(self.resnet_layers)} stage(s) has stride {stride}; "
                    f"patch_size must be a multiple of it, got {self.patch_size} (R50+B/16 uses "
                    "resnet_layers=(3, 4, 9) and patch_size=16)")
        if self.pool == "class_token" and not self.class_token:
            raise ConfigError("pool='class_token' needs class_token=True; without a class token "
                              "use pool='mean_patches'.")
        if self.pos_embed == "sincos2d" and self.width % 4:
            raise ConfigError(f"pos_embed='sincos2d' needs width divisible by 4, got {self.width}")
        if self.pos_embed == "sincos1d" and self.width % 2:
            raise ConfigError(f"pos_embed='sincos1d' needs an even width, got {self.width}")
        for key in ("dropout", "attn_dropout", "drop_path"):
            if not 0.0 <= getattr(self, key) < 1.0:
                raise ConfigError(f"{key} must be in [0, 1), got {getattr(self, key)}")
        if not 0.0 < self.norm_eps < 1.0:  # <= 0 can divide by zero (NaN outputs); NaN too
            raise ConfigError(f"norm_eps must be a small positive number (LayerNorm's epsilon: "
                              f"1e-6 as the paper's code, 1e-5 as PyTorch's default), got "
                              f"{self.norm_eps}")

    def _validate_conv_stem(self) -> None:
        halvings = self.patch_size.bit_length() - 1
        if 1 << halvings != self.patch_size or len(self.stem_channels) < halvings:
            raise ConfigError(
                f"stem='conv' halves the resolution once per stride-2 conv, so patch_size "
                f"must be a power of 2 and stem_channels must list at least log2(patch_size)"
                f" widths; got patch_size={self.patch_size}, "
                f"stem_channels={list(self.stem_channels)}")
        strides = self.stem_strides
        if strides and (len(strides) != len(self.stem_channels) or set(strides) - {1, 2}
                        or strides.count(2) != halvings):
            example = [1] * (len(self.stem_channels) - halvings) + [2] * halvings
            raise ConfigError(
                f"stem_strides={list(strides)} must give each of the {len(self.stem_channels)} "
                f"stem convs a stride of 1 or 2, with log2(patch_size)={halvings} of them 2 "
                f"(their product is the patch size {self.patch_size}), e.g. {example}")

    def stem_takes_patch(self, patch: int) -> bool:
        """Whether this model's stem can make `patch`-sized tokens: a conv stem a power of 2
        it has stride-2 convs for, a ResNet stem a multiple of its stride."""
        if self.stem == "conv":
            halvings = patch.bit_length() - 1
            if self.stem_strides:  # given stride by stride: their product is the patch
                return 1 << self.stem_strides.count(2) == patch
            return 1 << halvings == patch and len(self.stem_channels) >= halvings
        if self.stem == "resnet":
            return patch % (4 * 2 ** max(len(self.resnet_layers) - 1, 0)) == 0
        return True

    def conv_stem_strides(self) -> tuple[int, ...]:
        """The stride of each conv of a conv stem: `stem_strides`, or the last log2(P) 2."""
        if self.stem_strides:
            return self.stem_strides
        halvings = self.patch_size.bit_length() - 1
        return (1,) * (len(self.stem_channels) - halvings) + (2,) * halvings

    # -- (de)serialisation -------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["img_size"] = list(self.img_size)
        data["stem_channels"] = list(self.stem_channels)
        data["stem_strides"] = list(self.stem_strides)
        data["resnet_layers"] = list(self.resnet_layers)
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ViTConfig:
        """Build a config from a dict, refusing keys that are not config fields."""
        check_known_keys(cls, data, "config", PEER_NAMES)
        return cls(**data)

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2)
        if path is not None:
            Path(path).write_text(text + "\n")
        return text

    @classmethod
    def from_json(cls, path_or_text: str | Path) -> ViTConfig:
        """Read a config from a JSON file path or a JSON string."""
        text, source = str(path_or_text), "the config text"
        if not text.lstrip().startswith("{"):
            path = Path(path_or_text)
            if not path.is_file():
                guess = closest_path(path)
                raise ConfigError(f"config file {path} does not exist"
                                  + (f"; did you mean {guess}?" if guess else ""))
            check_json_size(path, ConfigError, "a model config is a JSON object of config "
                            "keys, as ViTConfig.to_json() writes it")
            try:
                text, source = path.read_text(), str(path)
            except UnicodeDecodeError:
                raise ConfigError(
                    f"{path} is not a JSON config file (it is binary). A checkpoint's config "
                    "is read with vitkit.catalog.config_of(path); `vitkit summary` "
                    "takes checkpoints directly.") from None
        data = parse_json(text, source, ConfigError, "a model config is a JSON object of "
                          "config keys, as ViTConfig.to_json() writes it")
        if not isinstance(data, dict):
            raise ConfigError(f"{source} must hold a JSON object of config keys, not "
                              f"{type(data).__name__}")
        return cls.from_dict(data)

    def replace(self, **overrides: Any) -> ViTConfig:
        """A copy with some fields changed; unknown field names are refused with a hint."""
        return ViTConfig.from_dict({**self.to_dict(), **overrides})


# -- names ------------------------------------------------------------------------------------
_VARIANT_RE = re.compile(r"^(?:vit[-_ ]?)?(ti|tiny|s|small|b|base|l|large|h|huge)[/_-]?(\d+)$",
                         re.IGNORECASE)
_HYBRID_RE = re.compile(r"^R(\d*)\+(.+)$", re.IGNORECASE)
# ResNet stems of the official hybrids: units per stage. R50 for /16 moves its 4th stage's
# units into the 3rd to keep stride 16; R50 for /32 and R26 keep four stages (stride 32);
# a bare "R" is the root block only (stride 4).
RESNET_LAYERS = {"": (), "26": (2, 2, 2, 2), "50": (3, 4, 9)}
_RESNET_LAYERS_BY_STRIDE32 = {"50": (3, 4, 6, 3)}
_TIMM_RE = re.compile(r"^vit_(tiny|small|base|large|huge)_patch(\d+)_(\d+)$", re.IGNORECASE)
# timm's hybrids: "vit_base_r50_s16_384"; the root-only ones add the patch on the stride-4 map
# ("vit_tiny_r_s16_p8_224" is 8x8 patches on the root block, 32 pixels per token).
_TIMM_HYBRID_RE = re.compile(r"^vit_(tiny|small|base|large|huge)_r(\d*)_s(\d+)(?:_p(\d+))?_(\d+)$",
                             re.IGNORECASE)
# The released root-only hybrid is named after the ViT it extends, not its token stride: the
# official "R+ViT-Ti_16" puts 8x8 patches on the stride-4 root block (32 pixels per token).
_OFFICIAL_HYBRID_NAMES = {"r+vit-ti_16": "R+Ti/32"}


def _einops_tutorial() -> dict[str, Any]:
    """The "Implementing ViT in PyTorch" (einops) tutorial model at 224/16/768/1000 classes.

    8 heads, PyTorch default LayerNorm eps and exact GELU; head = mean over all tokens ->
    LayerNorm -> Linear. Attention scales logits by 1/sqrt(D_h) as the paper does (the
    tutorial divides the softmax output by sqrt(emb_size), a bug we do not copy).
    """
    return dict(img_size=224, patch_size=16, width=768, depth=12, num_heads=8, mlp_dim=3072,
                pool="mean_all_tokens", final_norm="pooled", norm_eps=1e-5, init="trunc_normal",
                name="einops-tutorial")


def _cifar10_tutorial() -> dict[str, Any]:
    """The "ViT from scratch on CIFAR-10" tutorial model: 119,098 parameters.

    Image 32, patch 4, width 48, 4 layers, 4 heads, MLP 192, qkv bias, no dropout,
    trunc-normal(0.02) init; the head reads the class token with no final LayerNorm.
    """
    return dict(img_size=32, patch_size=4, num_classes=10, width=48, depth=4, num_heads=4,
                mlp_dim=192, final_norm="none", act="gelu_tanh", norm_eps=1e-5,
                init="trunc_normal", name="cifar10-tutorial")


def _t2t_tutorial() -> dict[str, Any]:
    """The regression ViT of the walkthrough built on the Tokens-to-Token ViT code (its
    `ViT_Model` defaults): one 400x100 channel (height x width), patch 50, width 768, depth
    12, one head, MLP 3072, no qkv bias, the fixed 1-D sinusoid table of T2T-ViT's
    `get_sinusoid_encoding` (a buffer: not a parameter), trunc-normal init, a class token, a
    final LayerNorm and one output, "a single estimated regression value": 86,950,657
    parameters. Built by name it carries the regression task (`TUTORIAL_TASKS`).
    """
    return dict(img_size=(400, 100), patch_size=50, in_chans=1, num_classes=1, width=768,
                depth=12, num_heads=1, mlp_dim=3072, qkv_bias=False, pos_embed="sincos1d",
                norm_eps=1e-5, init="trunc_normal", name="t2t-tutorial")


TUTORIAL_MODELS = {
    "einops-tutorial": _einops_tutorial,
    "cifar10-tutorial": _cifar10_tutorial,
    "t2t-tutorial": _t2t_tutorial,
}
# The task a tutorial model is built for, when it is not classification (`create_model` puts
# it on the model as `model.task`).
TUTORIAL_TASKS = {"t2t-tutorial": "regression"}


def variant_config(name: str, **overrides: Any) -> ViTConfig:
    """Parse a model name ("B/16", "ViT-L_32", "vit_base_patch16_224", "cifar10-tutorial").

    Keyword overrides replace any field before the config is checked, so
    `variant_config("B/16", img_size=384)` and `variant_config("S/20", img_size=(60, 100))`
    are both valid.
    """
    fields = _variant_fields(name)
    if fields is None:
        raise unknown_model_error(name, list_model_names())
    if "patch_size" in overrides and re.match(r"^(Ti|S|B|L|H)/\d+$", fields["name"]):
        fields["name"] = f"{fields['name'].split('/')[0]}/{overrides['patch_size']}"
    return ViTConfig.from_dict({**fields, **overrides})


def unknown_model_error(name: str, names: list[str], others: str = "") -> ConfigError:
    """The error for a name that names no model: the closest of `names`, and what names are
    (`others` adds the kinds of name the caller also takes)."""
    return ConfigError(f"unknown model {name!r}." + did_you_mean(name, names)
                       + " Names are a size Ti/S/B/L/H and a patch size, like 'B/16', or one of "
                       f"{', '.join(TUTORIAL_MODELS)}{others}; `vitkit models` lists them.")


def is_variant_name(name: str) -> bool:
    """Whether `name` has a variant's shape ("B/16", "R50+B/16", "vit_base_patch16_224", a
    tutorial model); one with a bad part ("R99+B/16") counts, `variant_config` says which."""
    try:
        return _variant_fields(name) is not None
    except ConfigError:
        return True


def _variant_fields(name: str) -> dict[str, Any] | None:
    """The config fields a variant name spells; None when `name` is not a variant name."""
    key = _OFFICIAL_HYBRID_NAMES.get(name.strip().lower(), name.strip())
    timm_hybrid = _TIMM_HYBRID_RE.match(key)
    if timm_hybrid:
        size, depth, stride, patch, img = timm_hybrid.groups()
        tokens_stride = int(stride) if patch is None else 4 * int(patch)
        fields = _variant_fields(f"R{depth}+{_SIZE_ALIASES[size.lower()]}/{tokens_stride}")
        return None if fields is None else {**fields, "img_size": int(img)}
    hybrid = _HYBRID_RE.match(key)
    if hybrid:
        depth = hybrid.group(1)
        if depth not in RESNET_LAYERS:
            raise ConfigError(f"unknown hybrid ResNet 'R{depth}' in {name!r}: use "
                              + ", ".join(f"'R{d}+'" for d in RESNET_LAYERS)
                              + " (e.g. 'R50+B/16')")
        fields = _variant_fields(hybrid.group(2))
        if fields is None:
            return None
        layers = RESNET_LAYERS[depth]
        if fields["patch_size"] % 32 == 0:
            layers = _RESNET_LAYERS_BY_STRIDE32.get(depth, layers)
        return {**fields, "stem": "resnet", "resnet_layers": layers,
                "name": f"R{depth}+{fields['name']}"}
    if key.lower() in TUTORIAL_MODELS:
        return TUTORIAL_MODELS[key.lower()]()
    img_size = 224
    match = _VARIANT_RE.match(key)
    if match is None:
        timm_match = _TIMM_RE.match(key)
        if timm_match is None:
            return None
        match, img_size = timm_match, int(timm_match.group(3))
    size = _SIZE_ALIASES[match.group(1).lower()]
    spec = SIZES[size]
    patch = int(match.group(2))
    return dict(img_size=img_size, patch_size=patch, width=spec.width, depth=spec.depth,
                num_heads=spec.num_heads, mlp_dim=spec.mlp_dim, name=f"{size}/{patch}")


def variant_name(config: ViTConfig) -> str:
    """The paper's name for a config ("B/16", "R50+B/16"), or "" when it is not a variant."""
    size = next((key for key, spec in SIZES.items()
                 if (spec.width, spec.depth, spec.mlp_dim, spec.num_heads)
                 == (config.width, config.depth, config.mlp_dim, config.num_heads)), None)
    if size is None:
        return ""
    if config.stem == "resnet":
        known = {**RESNET_LAYERS, **{d + " ": v for d, v in _RESNET_LAYERS_BY_STRIDE32.items()}}
        depth = next((d.strip() for d, layers in known.items()
                      if layers == config.resnet_layers), None)
        return f"R{depth}+{size}/{config.patch_size}" if depth is not None else ""
    return f"{size}/{config.patch_size}" if config.stem == "patch" else ""


def list_model_names() -> list[str]:
    """The names `vitkit models` shows: the common variants and the tutorial models."""
    return list(COMMON_VARIANTS) + list(TUTORIAL_MODELS)


def patch_sizes_in_words(height: int, width: int,
                         stem_takes: Callable[[int], bool] = lambda patch: True) -> str:
    """The patch sizes that divide both sides (up to 32) and the model's stem takes
    (`ViTConfig.stem_takes_patch`), in words for a message: the fix when the image size is
    the data's own."""
    sizes = [p for p in range(2, min(height, width, 32) + 1)
             if height % p == 0 == width % p and stem_takes(p)]
    if not sizes:
        return f"none above 1 does for {height}x{width} with this stem: resize the images"
    shown = [str(p) for p in sizes]
    words = shown[0] if len(shown) == 1 else ", ".join(shown[:-1]) + " or " + shown[-1]
    return f"patch_size {words} for {height}x{width}"


def _nearest_multiple(value: int, step: int) -> int:
    return max(step, round(value / step) * step)
