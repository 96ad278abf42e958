"""Weight initialisation schemes: the official JAX one and trunc-normal(0.02)."""

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


def init_jax_(model: nn.Module) -> None:
    """As the official code: xavier-uniform kernels, N(1e-6) MLP biases, zero head and class
    token, lecun-normal patch embedding and pre-logits, learned positions N(0, 0.02)."""
    for name, module in model.named_modules():
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
        elif isinstance(module, nn.Conv2d):
            lecun_normal_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm | nn.BatchNorm2d | nn.GroupNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    for name, module in model.named_modules():
        if name.endswith(".norm3") and isinstance(module, nn.GroupNorm):
            nn.init.zeros_(module.weight)  # bottleneck units start as identity (official)
    if getattr(model, "cls_token", None) is not None:
        nn.init.zeros_(model.cls_token)
    if isinstance(getattr(model, "pos_embed", None), nn.Parameter):
        nn.init.normal_(model.pos_embed, std=0.02)


def init_trunc_normal_(model: nn.Module) -> None:
    """Truncated normal (std 0.02) for every Linear/Conv weight, class token and learned
    position embedding; zero biases; LayerNorm at identity."""
    for module in model.modules():
        if isinstance(module, nn.Linear) or (isinstance(module, nn.Conv2d)
                                             and module.kernel_size[0] == module.stride[0]):
            trunc_normal_(module.weight)
            if module.bias is not None:
                nn.init.zeros_(module.bias)
        elif isinstance(module, nn.Conv2d):  # conv stem (with BatchNorm): He init
            nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
        elif isinstance(module, nn.LayerNorm | nn.BatchNorm2d | nn.GroupNorm):
            nn.init.ones_(module.weight)
            nn.init.zeros_(module.bias)
    if getattr(model, "cls_token", None) is not None:
        trunc_normal_(model.cls_token)
    if isinstance(getattr(model, "pos_embed", None), nn.Parameter):
        trunc_normal_(model.pos_embed)


INITIALISERS = {"jax": init_jax_, "trunc_normal": init_trunc_normal_}


@torch.no_grad()
def init_weights_(model: nn.Module, scheme: str) -> None:
    """Initialise `model` in place with a named scheme ("jax" or "trunc_normal")."""
    if any(p.is_meta for p in model.parameters()):
        return  # shapes only: nothing to fill
    INITIALISERS[scheme](model)
