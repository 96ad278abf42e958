"""The building blocks of eq. 2-3: multi-head self-attention, MLP, block, DropPath.

The stems (patch embedding, conv stem) live in `vitkit.model.stems`; `PatchEmbed` and
`ConvStem` stay importable from here under their old names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.model.chunked_attention import chunked_attention, use_chunked_attention
from vitkit.model.stems import ConvStem
from vitkit.model.stems import PatchStem as PatchEmbed

__all__ = ["Attention", "Block", "ConvStem", "DropPath", "Mlp", "PatchEmbed"]


class Attention(nn.Module):
    """MSA: [q, k, v] = z U_qkv; softmax(q k^T / sqrt(D_h)) v per head; heads projected.

    The normal path runs `scaled_dot_product_attention` (fused kernels); CPU training of
    short sequences with narrow heads runs `chunked_attention` (faster there); when attention
    weights are requested an explicit path computes them and gives the same output.
    `forward_first` attends from the first tokens only (the class-token shortcut).
    """

    def __init__(self, width: int, num_heads: int, qkv_bias: bool = True,
                 attn_dropout: float = 0.0, proj_dropout: float = 0.0) -> None:
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = width // num_heads
        self.scale = self.head_dim**-0.5
        self.attn_dropout = attn_dropout
        self.qkv = nn.Linear(width, 3 * width, bias=qkv_bias)
        self.proj = nn.Linear(width, width)
        self.attn_drop = nn.Dropout(attn_dropout)
        self.proj_drop = nn.Dropout(proj_dropout)

    def forward(self, x: torch.Tensor, return_attention: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch, tokens, width = x.shape
        qkv = self.qkv(x)
        dropout = self.attn_dropout if self.training else 0.0
        if not return_attention and use_chunked_attention(qkv, self.num_heads, dropout,
                                                          self.training):
            return self.proj_drop(self.proj(chunked_attention(qkv, self.num_heads))), None
        qkv = qkv.view(batch, tokens, 3, self.num_heads, self.head_dim)
        q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, T, D_h)
        weights = None
        if return_attention:
            weights = ((q * self.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
            out = self.attn_drop(weights) @ v
        else:
            out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
        out = out.transpose(1, 2).reshape(batch, tokens, width)
        return self.proj_drop(self.proj(out)), weights

    def forward_first(self, x: torch.Tensor, count: int = 1,
                      attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        """The output at the first `count` tokens only (B, count, D): every token is a key and
        a value, only those tokens query. Equal to `forward(x)[0][:, :count]`; `attn_bias`
        (broadcast to (B, heads, count, T)) is added to the logits (token merging's sizes)."""
        batch, tokens, width = x.shape
        if type(self.qkv) is nn.Linear:  # queries for the first tokens only
            weight, bias = self.qkv.weight, self.qkv.bias
            q = F.linear(x[:, :count], weight[:width], None if bias is None else bias[:width])
            kv = F.linear(x, weight[width:], None if bias is None else bias[width:])
        else:  # a replaced projection (int8, adapters): run it as it is
            q, kv = self.qkv(x).split([width, 2 * width], dim=-1)
            q = q[:, :count]
        q = q.reshape(batch, count, self.num_heads, self.head_dim).transpose(1, 2)
        kv = kv.reshape(batch, tokens, 2, self.num_heads, self.head_dim)
        k, v = kv[:, :, 0].transpose(1, 2), kv[:, :, 1].transpose(1, 2)  # (B, heads, T, D_h)
        dropout = self.attn_dropout if self.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=attn_bias, dropout_p=dropout)
        return self.proj_drop(self.proj(out.transpose(1, 2).reshape(batch, count, width)))


class Mlp(nn.Module):
    """Two linear layers with GELU between them (exact or tanh-approximated)."""

    def __init__(self, width: int, hidden: int, approximate: str = "none",
                 dropout: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(width, hidden)
        self.act = nn.GELU(approximate=approximate)
        self.fc2 = nn.Linear(hidden, width)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(self.act(self.fc1(x)))))


class DropPath(nn.Module):
    """Stochastic depth: drop a residual branch per sample while training, identity in eval."""

    def __init__(self, prob: float = 0.0) -> None:
        super().__init__()
        self.prob = prob

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.prob == 0.0 or not self.training:
            return x
        keep = 1.0 - self.prob
        mask = x.new_empty((x.shape[0],) + (1,) * (x.dim() - 1)).bernoulli_(keep)
        return x * mask / keep

    def extra_repr(self) -> str:
        return f"prob={self.prob}"


class Block(nn.Module):
    """One pre-norm encoder layer: z' = MSA(LN(z)) + z; z = MLP(LN(z')) + z' (eq. 2-3)."""

    def __init__(self, width: int, num_heads: int, mlp_dim: int, qkv_bias: bool = True,
                 dropout: float = 0.0, attn_dropout: float = 0.0, drop_path: float = 0.0,
                 approximate: str = "none", norm_eps: float = 1e-6) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(width, eps=norm_eps)
        self.attn = Attention(width, num_heads, qkv_bias, attn_dropout, dropout)
        self.drop_path1 = DropPath(drop_path)
        self.norm2 = nn.LayerNorm(width, eps=norm_eps)
        self.mlp = Mlp(width, mlp_dim, approximate, dropout)
        self.drop_path2 = DropPath(drop_path)

    def forward(self, x: torch.Tensor, return_attention: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        attended, weights = self.attn(self.norm1(x), return_attention)
        x = x + self.drop_path1(attended)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return x, weights

    def forward_first(self, x: torch.Tensor, count: int = 1,
                      attn_bias: torch.Tensor | None = None) -> torch.Tensor:
        """The block's output at the first `count` tokens only (B, count, D), all tokens
        attended to: equal to `forward(x)[0][:, :count]` at a fraction of the cost
        (`attn_bias`: see `Attention.forward_first`)."""
        attended = self.attn.forward_first(self.norm1(x), count, attn_bias)
        first = x[:, :count] + self.drop_path1(attended)
        return first + self.drop_path2(self.mlp(self.norm2(first)))
