"""Attention weights on request, and attention rollout (Abnar & Zuidema, 2020).

Rollout: fuse the heads of each layer (mean, max or min), optionally zero the weakest
entries, add the identity for the residual connection, renormalise each row to sum 1 and
multiply the layers, first layer first. The conventions, and how they compare with
jacobgil/vit-explain (`vit_rollout.py`, the recipe most users know), are stated in
`rollout_conventions`; explain.json carries them.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vitkit.config import ViTConfig
from vitkit.errors import ConfigError, InputError

HEAD_FUSIONS = ("mean", "max", "min")
MAP_SOURCES = ("class_token", "mean_of_tokens", "mean_of_all_tokens")


@torch.inference_mode()
def attention_weights(model: nn.Module, images: torch.Tensor
                      ) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """Logits and each layer's attention (B, heads, T, T) from the model's explicit path.

    Only this call computes attention weights; the model's normal forward stays fused.
    """
    was_training = model.training
    model.eval()
    try:
        logits, attentions = model(images, return_attention=True)
    finally:
        model.train(was_training)
    return logits, list(attentions)


def fuse_heads(attention: torch.Tensor, head_fusion: str = "mean") -> torch.Tensor:
    """(B, heads, T, T) -> (B, T, T) by the mean, max or min over heads."""
    if head_fusion == "mean":
        return attention.mean(dim=1)
    if head_fusion == "max":
        return attention.amax(dim=1)
    if head_fusion == "min":
        return attention.amin(dim=1)
    raise ConfigError(f"head_fusion={head_fusion!r} is not one of {', '.join(HEAD_FUSIONS)}")


def check_rollout_options(head_fusion: str, discard_ratio: float) -> None:
    """Refuse a head fusion rollout does not know or a discard ratio outside [0, 1)."""
    if head_fusion not in HEAD_FUSIONS:
        raise ConfigError(f"head_fusion={head_fusion!r} is not one of {', '.join(HEAD_FUSIONS)}")
    if not 0.0 <= discard_ratio < 1.0:  # NaN fails too
        raise ConfigError(f"discard_ratio must be in [0, 1) (the fraction of the weakest "
                          f"attentions zeroed; 0: none), got {discard_ratio}")


def discard_weakest(fused: torch.Tensor, discard_ratio: float,
                    num_prefix_tokens: int = 0) -> torch.Tensor:
    """Zero the weakest `discard_ratio` of each (T, T) matrix's entries.

    The columns of prefix (class) tokens are never discarded, so every token keeps its path
    to the class token; the ratio counts the other entries only: int(ratio * T * (T - P))
    entries are zeroed per image, P the prefix tokens. (vit-explain protects only entry
    (0, 0) and counts over all T * T entries.)
    """
    check_rollout_options("mean", discard_ratio)
    batch, tokens, _ = fused.shape
    candidates = fused.clone()
    candidates[:, :, :num_prefix_tokens] = float("inf")  # protected: never among the weakest
    count = int(discard_ratio * tokens * (tokens - num_prefix_tokens))
    if count == 0:
        return fused
    weakest = candidates.reshape(batch, -1).topk(count, dim=-1, largest=False).indices
    return fused.reshape(batch, -1).scatter(1, weakest, 0.0).reshape(fused.shape)


def attention_rollout(attentions: Sequence[torch.Tensor] | torch.Tensor,
                      head_fusion: str = "mean", discard_ratio: float = 0.0,
                      num_prefix_tokens: int = 0) -> torch.Tensor:
    """Attention rollout (B, T, T): row i says how much output token i draws on input token j.

    `attentions` holds one (B, heads, T, T) tensor per layer, first layer first. Each
    layer's fused matrix A (after discarding) becomes A + I with each row divided by its own
    sum, so every row of every layer is a distribution; the rollout is the product
    A_L ... A_1. With mean fusion and no discarding this equals vit-explain's rollout (its
    rows already sum to 1); for max/min fusion or a discard ratio > 0, vit-explain divides
    column j by the sum of row j instead, so its rows do not sum to 1 and its maps differ.
    """
    if len(attentions) == 0:
        raise InputError("attention_rollout needs at least one layer's attention weights")
    rollout = None
    for attention in attentions:
        if attention.dim() != 4 or attention.shape[-1] != attention.shape[-2]:
            raise InputError(f"each layer's attention must be (batch, heads, T, T), got "
                             f"{tuple(attention.shape)}")
        fused = fuse_heads(attention.double(), head_fusion)
        fused = discard_weakest(fused, discard_ratio, num_prefix_tokens)
        eye = torch.eye(fused.shape[-1], dtype=fused.dtype, device=fused.device)
        layer = fused + eye
        layer = layer / layer.sum(dim=-1, keepdim=True)
        rollout = layer if rollout is None else layer @ rollout
    return rollout.float()


def rollout_conventions(head_fusion: str, discard_ratio: float,
                        num_prefix_tokens: int) -> dict[str, str]:
    """The rollout conventions in words, for explain.json and the README."""
    if num_prefix_tokens:
        discard = ("the class token's column is never discarded: every token keeps its path to "
                   "it; the ratio counts the other T x (T - 1) entries of each layer (T tokens)")
    else:
        discard = "no class token: the ratio counts all T x T entries of each layer (T tokens)"
    if not num_prefix_tokens:
        vit_explain = ("jacobgil/vit-explain reads the class token's row, which this model "
                       "lacks; here the map is the mean of the patch tokens' rows")
    elif head_fusion == "mean" and discard_ratio == 0:
        vit_explain = "equal to jacobgil/vit-explain's rollout (mean fusion, ratio 0)"
    else:
        vit_explain = ("differs from jacobgil/vit-explain, which divides column j by the sum "
                       "of row j (not each row by its own sum) and protects only the class "
                       "token's attention to itself, counting the ratio over all T x T "
                       "entries; the two agree only for mean fusion at ratio 0")
    return {"rollout": f"per layer: heads fused by the {head_fusion}, the weakest "
                       f"{100 * discard_ratio:g}% of the entries zeroed, identity added, each "
                       "row divided by its own sum; layers multiplied first layer first",
            "discard": discard, "vit_explain": vit_explain}


def map_source(config: ViTConfig) -> str:
    """Which rollout row stands for the model's output, from its pooling.

    "class_token": the class token's row; "mean_of_tokens": the mean of the patch tokens'
    rows (the pooled output is their mean, so its rollout is the mean of their rows);
    "mean_of_all_tokens": the mean of all rows (pooling over every token, class token too).
    """
    pool, prefix = config.pool, config.num_prefix_tokens
    if pool == "class_token" and prefix:
        return "class_token"
    if pool == "mean_all_tokens" and prefix:
        return "mean_of_all_tokens"
    return "mean_of_tokens"


def output_token_map(rollout: torch.Tensor, num_prefix_tokens: int, grid: tuple[int, int],
                     source: str | None = None) -> torch.Tensor:
    """(B, gh, gw): the output's rollout row over the patch tokens.

    `source` defaults to "class_token" with a class token and "mean_of_tokens" without
    (see `map_source`).
    """
    source = source or ("class_token" if num_prefix_tokens else "mean_of_tokens")
    if source not in MAP_SOURCES:
        raise ConfigError(f"source={source!r} is not one of {', '.join(MAP_SOURCES)}")
    grid_h, grid_w = grid
    if rollout.shape[-1] != num_prefix_tokens + grid_h * grid_w:
        raise InputError(f"rollout over {rollout.shape[-1]} tokens does not fit a {grid_h}x"
                         f"{grid_w} grid with {num_prefix_tokens} prefix token(s)")
    if source == "class_token":
        if not num_prefix_tokens:
            raise ConfigError("source='class_token' needs a model with a class token; use "
                              "'mean_of_tokens'")
        rows = rollout[:, 0]
    elif source == "mean_of_tokens":
        rows = rollout[:, num_prefix_tokens:].mean(dim=1)
    else:
        rows = rollout.mean(dim=1)
    return rows[:, num_prefix_tokens:].reshape(-1, grid_h, grid_w)
