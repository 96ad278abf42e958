"""Self-attention for CPU training of small ViTs: the batch in cache-sized chunks.

At CIFAR scale (65 tokens, head dims 12-32) torch's fused CPU attention (the flash kernel
behind `scaled_dot_product_attention`) runs far below the machine's matmul speed, in the
forward and even more in the backward pass, and the plain form (two batched matmuls and a
softmax over the whole batch) streams every attention matrix through main memory several
times. `chunked_attention` computes the same softmax(q k^T / sqrt(D_h)) v with batched matmuls
over chunks of samples whose attention matrices fit in the cores' caches, keeps the
probabilities for the backward pass, and takes q, k, v straight from the fused qkv projection
(and hands its gradient back in that layout), with one layout copy per chunk each way.
"""

from __future__ import annotations

import torch

__all__ = ["CHUNK_ELEMENTS", "MAX_HEAD_DIM", "MAX_TOKENS", "chunked_attention",
           "use_chunked_attention"]

# Attention-matrix elements per chunk: 2 MiB of fp32, about one L2 cache per core of 2 cores.
CHUNK_ELEMENTS = 1 << 19
# Longer sequences keep SDPA: the kept probabilities grow with tokens^2.
MAX_TOKENS = 256
# Wider heads keep SDPA: measured in the training step on 2 cores, the chunked path took 0.7x
# SDPA's time at head dim 32 (the cifar10 recipe) and less at 12 (the tutorial), but 1.1x at 64.
MAX_HEAD_DIM = 32


def use_chunked_attention(qkv: torch.Tensor, num_heads: int, dropout: float) -> bool:
    """Whether the chunked path serves this call: CPU training in fp32/fp64 (a backward pass
    will follow), no attention dropout, at most MAX_TOKENS tokens and MAX_HEAD_DIM per head,
    not under compile or autocast (their own attention lowering stays in charge)."""
    return (qkv.device.type == "cpu" and qkv.requires_grad and torch.is_grad_enabled()
            and dropout == 0.0 and qkv.dtype in (torch.float32, torch.float64)
            and qkv.shape[1] <= MAX_TOKENS and qkv.shape[-1] // 3 // num_heads <= MAX_HEAD_DIM
            and not torch.is_autocast_enabled("cpu")
            and not torch.compiler.is_compiling() and not torch.jit.is_tracing())


def chunked_attention(qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Multi-head attention from the fused projection `qkv` (B, T, 3D), laid out [q | k | v]
    with heads contiguous inside each, to the concatenated heads (B, T, D): equal to
    `scaled_dot_product_attention` on the split heads, gradients included."""
    return _ChunkedAttention.apply(qkv.contiguous(), num_heads)


def _heads(qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """(c, T, 3D) -> a new tensor (3, c * heads, T, D_h) holding q, k, v per head."""
    batch, tokens, width3 = qkv.shape
    head_dim = width3 // 3 // num_heads
    heads = qkv.new_empty(3, batch * num_heads, tokens, head_dim)
    heads.view(3, batch, num_heads, tokens, head_dim).copy_(
        qkv.view(batch, tokens, 3, num_heads, head_dim).permute(2, 0, 3, 1, 4))
    return heads


class _ChunkedAttention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
        batch, tokens, width3 = qkv.shape
        width, head_dim = width3 // 3, width3 // 3 // num_heads
        scale = head_dim**-0.5
        chunk = max(1, CHUNK_ELEMENTS // (num_heads * tokens * tokens))
        spans = [(start, min(start + chunk, batch)) for start in range(0, batch, chunk)]
        out = qkv.new_empty(batch, tokens, width)
        heads, probs = [], []
        for start, stop in spans:
            h = _heads(qkv[start:stop], num_heads)
            q, k, v = h[0].mul_(scale), h[1], h[2]  # q pre-scaled, as kept for backward
            p = torch.bmm(q, k.transpose(1, 2)).softmax(dim=-1)
            o = torch.bmm(p, v).view(stop - start, num_heads, tokens, head_dim)
            out[start:stop].view(stop - start, tokens, num_heads, head_dim).copy_(
                o.transpose(1, 2))
            heads.append(h)
            probs.append(p)
        ctx.num_heads, ctx.scale = num_heads, scale
        ctx.kept = (spans, heads, probs)
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, None]:
        spans, heads, probs = ctx.kept
        ctx.kept = None
        grad_out = grad_out.contiguous()
        num_heads, scale = ctx.num_heads, ctx.scale
        batch, tokens, width = grad_out.shape
        head_dim = width // num_heads
        grad = grad_out.new_empty(batch, tokens, 3 * width)
        for (start, stop), h, p in zip(spans, heads, probs, strict=True):
            q, k, v = h[0], h[1], h[2]
            grad_o = (grad_out[start:stop].view(stop - start, tokens, num_heads, head_dim)
                      .transpose(1, 2).reshape(-1, tokens, head_dim))
            grad_h = torch.empty_like(h)
            torch.bmm(p.transpose(1, 2), grad_o, out=grad_h[2])
            grad_s = torch._softmax_backward_data(torch.bmm(grad_o, v.transpose(1, 2)), p,
                                                  -1, p.dtype)
            torch.bmm(grad_s, k, out=grad_h[0]).mul_(scale)
            torch.bmm(grad_s.transpose(1, 2), q, out=grad_h[1])  # q holds scale already
            grad[start:stop].view(stop - start, tokens, 3, num_heads, head_dim).copy_(
                grad_h.view(3, stop - start, num_heads, tokens, head_dim)
                .permute(1, 3, 0, 2, 4))
        return grad, None
