"""Self-attention for CPU training of small ViTs: the batch in cache-sized chunks.

At CIFAR scale (65 tokens, head dims 12-32) torch's fused CPU attention (the flash kernel
behind `scaled_dot_product_attention`) runs far below the machine's matmul speed, in the
forward and even more in the backward pass, and the plain form (two batched matmuls and a
softmax over the whole batch) streams every attention matrix through main memory several
times. `chunked_attention` computes the same softmax(q k^T / sqrt(D_h)) v with batched matmuls
over chunks of samples whose attention matrices fit in the cores' caches, keeps the
probabilities for the backward pass, and takes q, k, v straight from the fused qkv projection
(and hands its gradient back in that layout), with one layout copy per chunk each way.

Heads narrower than TRANSPOSED_BELOW are held transposed (D_h x T), so that the four products
whose result is T x D_h (p v in the forward pass; the gradients of q, k and v) are computed as
their transposes, D_h x T: BLAS kernels run a 12-column result far below a 65-column one.
"""

from __future__ import annotations

import torch

__all__ = ["CHUNK_ELEMENTS", "MAX_HEAD_DIM", "MAX_TOKENS", "TRANSPOSED_BELOW",
           "chunked_attention", "use_chunked_attention"]

# Attention-matrix elements per chunk: 2 MiB of fp32, about one L2 cache per core of 2 cores.
CHUNK_ELEMENTS = 1 << 19
# Longer sequences keep SDPA: the kept probabilities grow with tokens^2.
MAX_TOKENS = 256
# Wider heads keep SDPA: in the training step the chunked path beats it at head dims 12 (the
# tutorial) to 32 (the cifar10 recipe) and loses to it at 64.
MAX_HEAD_DIM = 32
# Head dims below this run the transposed products: the narrower the head, the more they gain
# (most at head dim 8, some at 12); from 16 on the plain layout is as fast or faster
# (benchmarks/step_ablation.py; its tables: benchmarks/README.md).
TRANSPOSED_BELOW = 16


def use_chunked_attention(qkv: torch.Tensor, num_heads: int, dropout: float,
                          training: bool = True) -> bool:
    """Whether the chunked path serves this call: CPU training (`training`, the module's
    mode, and a backward pass to follow) in fp32/fp64, no attention dropout, at most
    MAX_TOKENS tokens and MAX_HEAD_DIM per head, not under autocast (its own attention
    lowering stays in charge). Not under torch.func transforms (vmap, grad, jacrev: the op has
    no rules for them), nor while torch.export or torch.jit traces (an exported graph keeps
    SDPA, which loads without vitkit). Under `torch.compile` the op is traced whole; its
    chunks are counted from the batch size, so a graph holds for one batch size
    (`compile=true` compiles static shapes anyway)."""
    return (training and qkv.device.type == "cpu" and qkv.requires_grad
            and torch.is_grad_enabled()
            and dropout == 0.0 and qkv.dtype in (torch.float32, torch.float64)
            and qkv.shape[1] <= MAX_TOKENS and qkv.shape[-1] // 3 // num_heads <= MAX_HEAD_DIM
            and not torch.is_autocast_enabled("cpu")
            and not torch.jit.is_tracing() and not torch.compiler.is_exporting()
            and not _under_torch_func())


def _under_torch_func() -> bool:
    """Whether a torch.func transform (vmap, grad, jacrev, ...) is active; never asked while
    torch.compile traces (its own functional tracing is not one, and the op is kept there)."""
    return not torch.compiler.is_compiling() and torch._C._are_functorch_transforms_active()


def chunked_attention(qkv: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Multi-head attention from the fused projection `qkv` (B, T, 3D), laid out [q | k | v]
    with heads contiguous inside each, to the concatenated heads (B, T, D): equal to
    `scaled_dot_product_attention` on the split heads, gradients included. One custom op
    (`torch.ops.vitkit.chunked_attention`), so `torch.compile` keeps it whole and fuses what
    lies around it."""
    return torch.ops.vitkit.chunked_attention(qkv.contiguous(), num_heads)[0]


def _spans(batch: int, num_heads: int, tokens: int) -> list[tuple[int, int]]:
    """The chunks of samples whose attention matrices together hold about CHUNK_ELEMENTS."""
    chunk = max(1, CHUNK_ELEMENTS // (num_heads * tokens * tokens))
    return [(start, min(start + chunk, batch)) for start in range(0, batch, chunk)]


class _Layout:
    """Where q, k, v of one chunk live: (3, c * heads, T, D_h), or with `transposed`
    (3, c * heads, D_h, T); the products of attention in that layout."""

    def __init__(self, num_heads: int, head_dim: int, transposed: bool | None = None) -> None:
        self.num_heads, self.head_dim = num_heads, head_dim
        self.scale = head_dim**-0.5
        self.transposed = head_dim < TRANSPOSED_BELOW if transposed is None else transposed

    def inner(self, tokens: int) -> tuple[int, int]:
        """The last two dims of q, k, v per head: (D_h, T) transposed, else (T, D_h)."""
        return (self.head_dim, tokens) if self.transposed else (tokens, self.head_dim)

    def _per_head(self, tensor: torch.Tensor, samples: int, parts: int) -> torch.Tensor:
        """A (c, T, parts * D) tensor's view as (c, parts, heads, T, D_h) in this layout's
        order of the last two dims."""
        view = tensor.view(samples, tensor.shape[1], parts, self.num_heads, self.head_dim)
        return view.permute(0, 2, 3, 4, 1) if self.transposed else view.permute(0, 2, 3, 1, 4)

    def heads(self, tensor: torch.Tensor, parts: int) -> torch.Tensor:
        """(c, T, parts * D) -> a new tensor (parts, c * heads, ...) per head in this layout:
        q, k, v from the fused projection (parts=3), or the output's gradient (parts=1)."""
        samples, tokens = tensor.shape[:2]
        inner = self.inner(tokens)
        heads = tensor.new_empty(parts, samples * self.num_heads, *inner)
        heads.view(parts, samples, self.num_heads, *inner).copy_(
            self._per_head(tensor, samples, parts).transpose(0, 1))
        return heads

    def write(self, target: torch.Tensor, per_head: torch.Tensor, parts: int) -> None:
        """Copy `per_head` ((parts,) c * heads in this layout) into `target` (c, T, parts * D)."""
        samples = target.shape[0]
        inner = per_head.shape[-2:]
        self._per_head(target, samples, parts).copy_(
            per_head.view(parts, samples, self.num_heads, *inner).transpose(0, 1))

    def scores(self, q: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
        """q k^T, (n, T, T)."""
        return torch.bmm(q.transpose(1, 2), k) if self.transposed else torch.bmm(
            q, k.transpose(1, 2))

    def times(self, p: torch.Tensor, x: torch.Tensor, out: torch.Tensor | None = None
              ) -> torch.Tensor:
        """p x for a (n, T, T) matrix p and a (n, T, D_h) x, both x and the result in this
        layout (transposed: x^T p^T, which is (p x)^T)."""
        if self.transposed:
            return torch.bmm(x, p.transpose(1, 2), out=out)
        return torch.bmm(p, x, out=out)


# Explicit schemas: no reliance on type inference (older torch reads `typing.List` only).
@torch.library.custom_op("vitkit::chunked_attention", mutates_args=(),
                         schema="(Tensor qkv, int num_heads) -> (Tensor, Tensor[], Tensor[])")
def _forward(qkv: torch.Tensor, num_heads: int
             ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    """The attention output, and per chunk q, k, v in the layout (q pre-scaled) and the
    probabilities, both kept for the backward pass."""
    batch, tokens, width3 = qkv.shape
    layout = _Layout(num_heads, width3 // 3 // num_heads)
    out = qkv.new_empty(batch, tokens, width3 // 3)
    heads, probs = [], []
    for start, stop in _spans(batch, num_heads, tokens):
        h = layout.heads(qkv[start:stop], 3)
        q, k, v = h[0].mul_(layout.scale), h[1], h[2]
        p = layout.scores(q, k).softmax(dim=-1)
        layout.write(out[start:stop], layout.times(p, v), 1)
        heads.append(h)
        probs.append(p)
    return out, heads, probs


@_forward.register_fake
def _forward_shapes(qkv: torch.Tensor, num_heads: int
                    ) -> tuple[torch.Tensor, list[torch.Tensor], list[torch.Tensor]]:
    batch, tokens, width3 = qkv.shape
    layout = _Layout(num_heads, width3 // 3 // num_heads)
    spans = _spans(batch, num_heads, tokens)
    return (qkv.new_empty(batch, tokens, width3 // 3),
            [qkv.new_empty(3, (stop - start) * num_heads, *layout.inner(tokens))
             for start, stop in spans],
            [qkv.new_empty((stop - start) * num_heads, tokens, tokens) for start, stop in spans])


@torch.library.custom_op(
    "vitkit::chunked_attention_backward", mutates_args=(),
    schema="(Tensor grad_out, Tensor[] heads, Tensor[] probs, int num_heads, bool transposed)"
           " -> Tensor")
def _backward(grad_out: torch.Tensor, heads: list[torch.Tensor], probs: list[torch.Tensor],
              num_heads: int, transposed: bool) -> torch.Tensor:
    """The gradient of the fused projection, in its layout, from the kept chunks."""
    grad_out = grad_out.contiguous()
    batch, tokens, width = grad_out.shape
    layout = _Layout(num_heads, width // num_heads, transposed)
    grad = grad_out.new_empty(batch, tokens, 3 * width)
    start = 0
    for h, p in zip(heads, probs, strict=True):  # the forward pass's chunks, as kept
        stop = start + p.shape[0] // num_heads
        q, k, v = h[0], h[1], h[2]
        grad_o = layout.heads(grad_out[start:stop], 1)[0]
        grad_h = torch.empty_like(h)
        layout.times(p.transpose(1, 2), grad_o, out=grad_h[2])
        grad_s = torch._softmax_backward_data(layout.scores(grad_o, v), p, -1, p.dtype)
        layout.times(grad_s, k, out=grad_h[0]).mul_(layout.scale)
        layout.times(grad_s.transpose(1, 2), q, out=grad_h[1])  # q holds the scale already
        layout.write(grad[start:stop], grad_h, 3)
        start = stop
    return grad


@_backward.register_fake
def _backward_shape(grad_out: torch.Tensor, heads: list[torch.Tensor],
                    probs: list[torch.Tensor], num_heads: int, transposed: bool
                    ) -> torch.Tensor:
    batch, tokens, width = grad_out.shape
    return grad_out.new_empty(batch, tokens, 3 * width)


def _keep_for_backward(ctx, inputs: tuple, output: tuple) -> None:
    _, heads, probs = output
    ctx.num_heads = inputs[1]
    ctx.transposed = _Layout(inputs[1], inputs[0].shape[-1] // 3 // inputs[1]).transposed
    ctx.save_for_backward(*heads, *probs)
    ctx.chunks = len(heads)
    ctx.mark_non_differentiable(*heads, *probs)
    ctx.set_materialize_grads(False)  # no zero gradients for the kept chunks


def _gradient(ctx, grad_out: torch.Tensor, *_kept_grads) -> tuple[torch.Tensor, None]:
    kept = ctx.saved_tensors
    heads, probs = list(kept[:ctx.chunks]), list(kept[ctx.chunks:])
    return _backward(grad_out, heads, probs, ctx.num_heads, ctx.transposed), None


_forward.register_autograd(_gradient, setup_context=_keep_for_backward)
