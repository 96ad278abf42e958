"""Weight initialisation schemes: the official JAX one and trunc-normal(0.02).

The model's stem initialises itself (`Stem.init_weights_`) with the helpers for stems below;
the schemes here cover the transformer: tokens, positions, blocks and head.
"""

from __future__ import annotations

import math

import torch
from torch import nn

# Flax's truncated-normal variance scaling divides the std by this so the truncated
# distribution keeps the requested variance.
_TRUNC_STD_CORRECTION = 0.87962566103423978


def lecun_normal_(tensor: torch.Tensor) -> torch.Tensor:
    """Flax's default kernel init: truncated normal with variance 1 / fan_in."""
    fan_in = tensor[0].numel()
    std = math.sqrt(1.0 / fan_in) / _TRUNC_STD_CORRECTION
    return nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)


def trunc_normal_(tensor: torch.Tensor, std: float = 0.02) -> torch.Tensor:
    return nn.init.trunc_normal_(tensor, std=std, a=-2 * std, b=2 * std)


# -- stems (called by each Stem.init_weights_) --------------------------------------------------
def init_projection_(conv: nn.Conv2d, scheme: str) -> None:
    """The token projection: lecun normal ("jax", as the official patch embedding) or
    trunc-normal(0.02); zero bias."""
    (lecun_normal_ if scheme == "jax" else trunc_normal_)(conv.weight)
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)


def init_feature_conv_(conv: nn.Conv2d, scheme: str) -> None:
    """A CNN convolution before the projection: lecun normal ("jax", flax's default) or He
    normal (fan-out, ReLU) for "trunc_normal"; zero bias."""
    if scheme == "jax":
        lecun_normal_(conv.weight)
    else:
        nn.init.kaiming_normal_(conv.weight, mode="fan_out", nonlinearity="relu")
    if conv.bias is not None:
        nn.init.zeros_(conv.bias)


def init_norm_(norm: nn.Module) -> None:
    """BatchNorm / GroupNorm / LayerNorm at identity: scale 1, shift 0."""
    nn.init.ones_(norm.weight)
    nn.init.zeros_(norm.bias)


def init_residual_norm_(norm: nn.Module, scheme: str) -> None:
    """The last norm of a residual unit: zero scale under "jax" (the official ResNet starts
    each bottleneck unit as the identity), identity otherwise."""
    init_norm_(norm)
    if scheme == "jax":
        nn.init.zeros_(norm.weight)


# -- the transformer --------------------------------------------------------------------------
def init_jax_(model: nn.Module) -> None:
    """As the official code: xavier-uniform kernels, N(1e-6) MLP biases, zero head and class
    token, lecun-normal pre-logits, learned positions N(0, 0.02)."""
    for name, module in _transformer_modules(model):
        if isinstance(module, nn.Linear):
            if name == "head":
                nn.init.zeros_(module.weight)
            elif name.startswith("pre_logits"):
                lecun_normal_(module.weight)
            elif name.endswith("attn.qkv"):
                # q, k and v are separate (D, D) kernels in the official code.
                fan_in, fan_out = module.weight.shape[1], module.weight.shape[0] // 3
                bound = math.sqrt(6.0 / (fan_in + fan_out))
                nn.init.uniform_(module.weight, -bound, bound)
            else:
                nn.init.xavier_uniform_(module.weight)
            if module.bias is not None:
                if ".mlp." in f".{name}.":
                    nn.init.normal_(module.bias, std=1e-6)
                else:
                    nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init_norm_(module)
    if getattr(model, "cls_token", None) is not None:
        nn.init.zeros_(model.cls_token)
    if isinstance(getattr(model, "pos_embed", None), nn.Parameter):
        nn.init.normal_(model.pos_embed, std=0.02)


def init_trunc_normal_(model: nn.Module) -> None:
    """Truncated normal (std 0.02) for every Linear weight, class token and learned position
    embedding; zero biases; LayerNorm at identity."""
    for _, module in _transformer_modules(model):
        if isinstance(module, nn.Linear):
            trunc_normal_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init_norm_(module)
    if getattr(model, "cls_token", None) is not None:
        trunc_normal_(model.cls_token)
    if isinstance(getattr(model, "pos_embed", None), nn.Parameter):
        trunc_normal_(model.pos_embed)


def _transformer_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """Named modules outside the stem (`model.patch_embed`), in registration order."""
    stem = set(model.patch_embed.modules())
    return [(name, module) for name, module in model.named_modules() if module not in stem]


INITIALISERS = {"jax": init_jax_, "trunc_normal": init_trunc_normal_}


@torch.no_grad()
def init_weights_(model: nn.Module, scheme: str) -> None:
    """Initialise `model` in place with a named scheme ("jax" or "trunc_normal"): the stem
    first (it knows its layers), then the transformer."""
    if any(p.is_meta for p in model.parameters()):
        return  # shapes only: nothing to fill
    model.patch_embed.init_weights_(scheme)
    INITIALISERS[scheme](model)
