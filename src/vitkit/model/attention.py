"""The attention kernel: softmax(q k^T / sqrt(D_h)) v for all heads, from one qkv tensor.

On CUDA and for long sequences the fused `scaled_dot_product_attention` is the fastest path.
On CPU at the short sequences of small and CIFAR-sized ViTs (tens of tokens) it is not: its
flash kernel works in blocks whose overhead dominates when a head is 12-64 wide, and its
backward recomputes the attention matrix. `BatchedAttention` computes the same function with
two batched matmuls and one softmax, keeps the attention matrix for the backward pass
(B * heads * T^2 floats: 17 MB for the tutorial's step), and returns the gradient of q, k and
v as one tensor in the qkv projection's layout (one copy, none left for autograd).

`attend` picks the path (`uses_batched_kernel`): the batched kernel for CPU training passes
of at most `BATCHED_MAX_TOKENS` tokens without attention dropout, SDPA otherwise. Both give
the same values, float rounding apart (tests/test_attention_kernel.py: values and gradients
against SDPA in float64, and a whole training step against timm's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["BATCHED_MAX_TOKENS", "BatchedAttention", "attend", "merge_heads", "split_heads",
           "uses_batched_kernel"]

# Up to this many tokens the batched kernel beats SDPA on CPU, forward and backward
# (benchmarks/attention.py: tutorial, CIFAR and B/16 shapes). Above it, and always on other
# devices, SDPA runs.
BATCHED_MAX_TOKENS = 128


def split_heads(qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(B, T, 3 * width) -> contiguous (3, B * heads, T, D_h): q, k and v per head."""
    batch, tokens, three_width = qkv.shape
    head_dim = three_width // (3 * num_heads)
    return (qkv.view(batch, tokens, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4)
            .reshape(3, batch * num_heads, tokens, head_dim))


def merge_heads(out: torch.Tensor, batch: int) -> torch.Tensor:
    """(B * heads, T, D_h) -> (B, T, heads * D_h)."""
    heads_batch, tokens, head_dim = out.shape
    heads = heads_batch // batch
    return out.view(batch, heads, tokens, head_dim).transpose(1, 2).reshape(
        batch, tokens, heads * head_dim)


class BatchedAttention(torch.autograd.Function):
    """Multi-head attention of a (B, T, 3 * width) qkv tensor; returns (B, T, width)."""

    @staticmethod
    def forward(ctx, qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
        batch = qkv.shape[0]
        q, k, v = split_heads(qkv, num_heads)
        scale = q.shape[-1] ** -0.5
        logits = torch.baddbmm(q.new_empty(()), q, k.transpose(1, 2), beta=0.0, alpha=scale)
        weights = torch.softmax(logits, dim=-1)
        del logits
        out = torch.bmm(weights, v)
        ctx.save_for_backward(q, k, v, weights)
        ctx.num_heads, ctx.scale, ctx.qkv_shape = num_heads, scale, qkv.shape
        return merge_heads(out, batch)

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        q, k, v, weights = ctx.saved_tensors
        batch, tokens, three_width = ctx.qkv_shape
        heads, scale = ctx.num_heads, ctx.scale
        head_dim = q.shape[-1]
        grad_o = grad_out.reshape(batch, tokens, heads, head_dim).transpose(1, 2).reshape(
            batch * heads, tokens, head_dim)
        packed = q.new_empty((3, batch * heads, tokens, head_dim))
        torch.bmm(weights.transpose(1, 2), grad_o, out=packed[2])
        grad_weights = torch.bmm(grad_o, v.transpose(1, 2))
        grad_logits = torch._softmax_backward_data(grad_weights, weights, -1, weights.dtype)
        del grad_weights
        torch.baddbmm(packed[0], grad_logits, k, beta=0.0, alpha=scale, out=packed[0])
        torch.baddbmm(packed[1], grad_logits.transpose(1, 2), q, beta=0.0, alpha=scale,
                      out=packed[1])
        grad_qkv = packed.view(3, batch, heads, tokens, head_dim).permute(1, 3, 0, 2, 4)
        return grad_qkv.reshape(batch, tokens, three_width), None


def uses_batched_kernel(qkv: torch.Tensor, dropout: float = 0.0) -> bool:
    """Whether `attend` runs `BatchedAttention`: a training pass (gradients needed) on CPU in
    float32/64, at most `BATCHED_MAX_TOKENS` tokens, no attention dropout, not being traced.
    (Forward alone, SDPA is as fast at these shapes and keeps no attention matrix.)"""
    return (qkv.device.type == "cpu" and qkv.dtype in (torch.float32, torch.float64)
            and qkv.requires_grad and torch.is_grad_enabled() and dropout == 0.0
            and qkv.shape[1] <= BATCHED_MAX_TOKENS and not torch.jit.is_tracing()
            and not torch.compiler.is_compiling())


def attend(qkv: torch.Tensor, num_heads: int, dropout: float = 0.0) -> torch.Tensor:
    """softmax(q k^T / sqrt(D_h)) v of a (B, T, 3 * width) qkv tensor, as (B, T, width)."""
    if uses_batched_kernel(qkv, dropout):
        return BatchedAttention.apply(qkv, num_heads)
    batch, tokens, three_width = qkv.shape
    head_dim = three_width // (3 * num_heads)
    q, k, v = qkv.view(batch, tokens, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4).unbind(0)
    out = F.scaled_dot_product_attention(q, k, v, dropout_p=dropout)
    return out.transpose(1, 2).reshape(batch, tokens, three_width // 3)
