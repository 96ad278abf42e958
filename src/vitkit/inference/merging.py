"""Token Merging (ToMe, Bolya et al., ICLR 2023): fewer tokens per layer, no retraining.

In each block, after the attention and before the MLP, `r` patch tokens are merged into
others by bipartite soft matching: the patch tokens alternate into sets A and B, each A token
finds the B token whose attention key (averaged over heads) is most cosine-similar, and the
`r` most similar pairs are merged into one token, the size-weighted average of the two. The
prefix (class) token is never merged. Each token carries its size (how many patches it
stands for); the attention adds log(size) to its logits (proportional attention), so a merged
token draws as much attention as the duplicates it replaced, and mean pooling weights tokens
by size.

`apply_token_merging(model, r)` switches a loaded `VisionTransformer` to merging in place
(the classes of the model and its blocks are swapped; parameters and state dict stay); `r=0`
switches it back to the plain classes, so the plain code path runs again.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.nn.functional as F

from vitkit.config import ViTConfig
from vitkit.errors import ConfigError
from vitkit.model.layers import Attention, Block
from vitkit.model.vit import VisionTransformer

__all__ = ["MergingBlock", "MergingVisionTransformer", "apply_token_merging",
           "attend_with_sizes", "check_merge_count", "clip_merge_count", "largest_merge_count",
           "merge_schedule", "merge_tokens", "size_bias"]


def clip_merge_count(r: int, tokens: int, num_prefix: int) -> int:
    """The number of tokens one layer can merge: at most half the patch tokens (the size of
    set A when B must keep a match), so at least the prefix tokens + 1 remain."""
    return max(0, min(r, (tokens - num_prefix) // 2))


def largest_merge_count(config: ViTConfig) -> int:
    """The largest r that acts as asked in the first layer: half the model's patch tokens
    (a larger r is clipped to it, so it only looks like more merging)."""
    return clip_merge_count(config.num_patches, config.seq_len, config.num_prefix_tokens)


def check_merge_count(config: ViTConfig, r: int) -> None:
    """Refuse an r that no layer can merge (`--merge-tokens 20` on a 16-token model), with the
    tokens the model has and the largest r that makes sense. `apply_token_merging` itself
    clips a large r (a schedule that runs out of tokens is allowed there); the verbs that
    take --merge-tokens (eval, predict, benchmark) check first."""
    largest = largest_merge_count(config)
    if r > largest:
        raise ConfigError(
            f"cannot merge {r} tokens per layer: the model has {config.num_patches} patch "
            f"tokens (+{config.num_prefix_tokens} prefix), and a layer merges at most half "
            f"of them: use --merge-tokens {largest} or less")


def merge_schedule(config: ViTConfig, r: int, tokens: int) -> list[int]:
    """The token schedule of a model that merges `r` tokens in every layer from `tokens`
    (prefix included) at its input: the tokens each layer keeps (for
    `vitkit.summary.forward_flops`)."""
    schedule = []
    for _ in range(config.depth):
        tokens -= clip_merge_count(r, tokens, config.num_prefix_tokens)
        schedule.append(tokens)
    return schedule


def merge_tokens(x: torch.Tensor, size: torch.Tensor, keys: torch.Tensor, r: int,
                 num_prefix: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge `r` patch tokens of `x` (B, T, D) by bipartite soft matching on `keys` (B, T, K).

    Patch tokens (after the `num_prefix` prefix tokens) alternate into A (even) and B (odd);
    each A token's best B match by cosine similarity of the keys is an edge; the `r` edges
    of highest similarity merge their A token into its B token as the size-weighted average
    (`size` (B, T, 1) holds each token's size). Returns (tokens, sizes) with T - r tokens:
    the prefix, then the unmerged A tokens in their order, then the B tokens.

    The tokens move once, by one row gather into the output; then only the B tokens that
    take merges are computed again (in at least float32, rounded once to x's dtype). Every
    shape is fixed by x and r (no data-dependent sizes: meta tensors and compile work).
    """
    r = clip_merge_count(r, x.shape[1], num_prefix)
    if r == 0:
        return x, size
    batch, tokens, width = x.shape
    metric = F.normalize(keys[:, num_prefix:], dim=-1)
    scores = metric[:, ::2] @ metric[:, 1::2].transpose(1, 2)  # (B, |A|, |B|)
    best_score, best_match = scores.max(dim=-1)
    order = best_score.argsort(dim=-1, descending=True)
    merged_a, kept_a = order[:, :r], order[:, r:].sort(dim=-1).values
    target_b = best_match.gather(1, merged_a)

    count_a, count_b = scores.shape[1:]
    steps = torch.arange(max(num_prefix, count_b), device=x.device)
    samples = torch.arange(batch, device=x.device)[:, None]
    rows_in, rows_out = samples * tokens, samples * (tokens - r)
    kept = torch.cat([steps[:num_prefix].expand(batch, -1), num_prefix + 2 * kept_a,
                      (num_prefix + 1 + 2 * steps[:count_b]).expand(batch, -1)], dim=1)
    kept = (rows_in + kept).flatten()  # the rows of x that stay, in output order
    moved = (rows_in + num_prefix + 2 * merged_a).flatten()  # the A rows merged away
    targets = (rows_out + num_prefix + count_a - r + target_b).flatten()  # their B rows, out
    x_rows, size_rows = x.reshape(-1, width), size.reshape(-1, 1)
    new_x, new_size = x_rows.index_select(0, kept), size_rows.index_select(0, kept)

    # each target: (x_b size_b + its A tokens' x_a size_a) / (size_b + their size_a), in at
    # least float32 and rounded once. Each merged A token gets the sum over the A tokens that
    # share its target as a 0/1 matrix product, not a scatter-add: torch's ONNX exporter
    # writes index_add_ as a scatter without its reduction, which loses all but one addend.
    # Autocast stays off there: it would round the sums (and sizes above 256) to bf16.
    exact = torch.promote_types(x.dtype, torch.float32)
    same_target = (target_b[:, :, None] == target_b[:, None, :]).to(exact)  # (B, r, r)
    moved_size = size_rows.index_select(0, moved).to(exact)
    moved_x = x_rows.index_select(0, moved).to(exact) * moved_size
    with _autocast_off(x.device.type):
        slot_x = torch.bmm(same_target, moved_x.view(batch, r, width)).view(-1, width)
        slot_size = torch.bmm(same_target, moved_size.view(batch, r, 1)).view(-1, 1)
    target_x = new_x.index_select(0, targets).to(exact)
    target_size = new_size.index_select(0, targets).to(exact)
    total = target_size + slot_size
    new_x.index_copy_(0, targets, ((target_x * target_size + slot_x) / total).to(x.dtype))
    new_size.index_copy_(0, targets, total.to(size.dtype))
    return new_x.view(batch, tokens - r, width), new_size.view(batch, tokens - r, 1)


def _autocast_off(device_type: str) -> contextlib.AbstractContextManager:
    """A context with autocast off on `device_type` (nothing where autocast does not exist:
    the meta device)."""
    if torch.amp.is_autocast_available(device_type):
        return torch.autocast(device_type, enabled=False)
    return contextlib.nullcontext()


def size_bias(size: torch.Tensor | None, dtype: torch.dtype) -> torch.Tensor | None:
    """Proportional attention's logit bias: log(size) of each key token (B, 1, 1, T), from
    the sizes (B, T, 1); None when every token has size 1 (`size` None)."""
    return None if size is None else size.log().to(dtype).view(size.shape[0], 1, 1, size.shape[1])


def attend_with_sizes(attn: Attention, x: torch.Tensor, size: torch.Tensor | None,
                      return_attention: bool = False
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """`attn`'s multi-head self-attention with proportional attention: log(size) of each key
    token added to the logits (nothing when `size` is None: every token has size 1).

    Returns (output, keys averaged over heads (B, T, D_h), weights or None).
    """
    batch, tokens, width = x.shape
    qkv = attn.qkv(x).view(batch, tokens, 3, attn.num_heads, attn.head_dim)
    q, k, v = qkv.permute(2, 0, 3, 1, 4).unbind(0)  # each (B, heads, T, D_h)
    bias = size_bias(size, q.dtype)
    weights = None
    if return_attention:
        logits = (q * attn.scale) @ k.transpose(-2, -1)
        weights = (logits if bias is None else logits + bias).softmax(dim=-1)
        out = attn.attn_drop(weights) @ v
    else:
        dropout = attn.attn_dropout if attn.training else 0.0
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=bias, dropout_p=dropout)
    out = out.transpose(1, 2).reshape(batch, tokens, width)
    return attn.proj_drop(attn.proj(out)), k.mean(dim=1), weights


class MergingBlock(Block):
    """A `Block` that merges `merge_r` tokens between its attention and its MLP."""

    merge_r: int = 0
    num_prefix: int = 0

    def forward_merging(self, x: torch.Tensor, size: torch.Tensor | None,
                        return_attention: bool = False
                        ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """(tokens, sizes, attention weights): z' = MSA(LN(z)) + z; merge; z = MLP(LN(z')) + z'."""
        attended, keys, weights = attend_with_sizes(self.attn, self.norm1(x), size,
                                                    return_attention)
        x = x + self.drop_path1(attended)
        if clip_merge_count(self.merge_r, x.shape[1], self.num_prefix) > 0:
            if size is None:
                size = x.new_ones(x.shape[0], x.shape[1], 1)
            x, size = merge_tokens(x, size, keys, self.merge_r, self.num_prefix)
        x = x + self.drop_path2(self.mlp(self.norm2(x)))
        return x, size, weights

    def forward(self, x: torch.Tensor, return_attention: bool = False
                ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """As `Block.forward`, for a block called alone (sizes start at 1)."""
        x, _, weights = self.forward_merging(x, None, return_attention)
        return x, weights


class MergingVisionTransformer(VisionTransformer):
    """A `VisionTransformer` whose blocks merge tokens (see `apply_token_merging`).

    `forward_features` returns the merged tokens and keeps their sizes in `token_sizes`
    (B, T', 1) for `pool`; with `return_attention` each layer's weights have that layer's
    token count. The mean pools weight each token by its size. `forward` takes the class-token
    shortcut as `VisionTransformer.forward` does (then `token_sizes` is the class token's).
    `merge_r`: the tokens merged per layer; code below this package (the ONNX export) reads
    it as `getattr(model, "merge_r", 0)`.
    """

    token_sizes: torch.Tensor | None = None

    @property
    def merge_r(self) -> int:
        """The tokens each block merges (`apply_token_merging`'s r)."""
        return max((getattr(block, "merge_r", 0) for block in self.blocks), default=0)

    def forward(self, images: torch.Tensor, return_attention: bool = False
                ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """As `VisionTransformer.forward`, with its class-token shortcut: a model that pools
        its class token runs the last block for that token alone (merging there never moves
        the class token), with proportional attention over the merged tokens."""
        if return_attention or not self.pools_class_token_only():
            return super().forward(images, return_attention)
        x, size = self.embed(images), None
        for block in self.blocks[:-1]:
            x, size, _ = self.call_block(block.forward_merging, x, size)
        self.token_sizes = None if size is None else size[:, :1]  # out of the last block
        first = self.call_block(self.blocks[-1].forward_first, x, 1, size_bias(size, x.dtype))
        return self.forward_head(self.norm(first))

    def pools_class_token_only(self) -> bool:
        """Whether forward takes the shortcut: merging blocks throughout and the model's
        output needing the class token alone (`class_token_alone_suffices`)."""
        return (all(type(block) is MergingBlock for block in self.blocks)
                and self.class_token_alone_suffices())

    def forward_features(self, images: torch.Tensor, return_attention: bool = False
                         ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        x, size = self.embed(images), None
        attentions = []
        for block in self.blocks:
            x, size, weights = self.call_block(block.forward_merging, x, size, return_attention)
            if return_attention:
                attentions.append(weights)
        self.token_sizes = size
        x = self.norm(x)
        return (x, attentions) if return_attention else x

    def forward_intermediates(self, images: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        """Refused: merged tokens form no grid, and sizes would restart in each block."""
        raise ConfigError("forward_intermediates needs every patch token, which token merging "
                          "merges away: call apply_token_merging(model, 0) first")

    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """The class token, or a size-weighted mean over the (merged) tokens."""
        size = self.token_sizes
        if self.config.pool == "class_token" or size is None or size.shape[:2] != tokens.shape[:2]:
            return super().pool(tokens)
        start = self.config.num_prefix_tokens if self.config.pool == "mean_patches" else 0
        weights = size[:, start:].to(tokens.dtype)
        return (tokens[:, start:] * weights).sum(dim=1) / weights.sum(dim=1)


def apply_token_merging(model: VisionTransformer, r: int) -> VisionTransformer:
    """Merge `r` tokens in every layer of `model` (in place; returns it), or with `r=0` restore
    the plain model (bit-for-bit the same outputs: the plain code path runs).

    Per layer, r is clipped so that at least the prefix tokens + 1 remain; a model with T
    tokens and L layers ends with T - L*r tokens when that clip never acts. Works with any
    pool (the mean pools use a size-weighted mean), `return_attention` (per-layer weights of
    shrinking size) and a dynamic image size. Apply it before `quantize_int8`.
    """
    if not isinstance(model, VisionTransformer):
        raise ConfigError(f"token merging applies to a vitkit VisionTransformer, not a "
                          f"{type(model).__name__}; load the model with vitkit.load_pretrained "
                          "or vitkit.create_model")
    if isinstance(r, bool) or not isinstance(r, int) or r < 0:
        raise ConfigError(f"the number of tokens to merge per layer must be an integer >= 0, "
                          f"got {r!r}; use 0 for no merging (e.g. --merge-tokens 8)")
    blocks = list(model.blocks)
    if not all(isinstance(block, Block) for block in blocks):
        raise ConfigError("token merging needs vitkit's own encoder blocks; apply it to the "
                          "model as loaded, before replacing its blocks")
    if r == 0:
        for block in blocks:
            if isinstance(block, MergingBlock):
                block.__class__ = Block
                del block.merge_r, block.num_prefix
        if isinstance(model, MergingVisionTransformer):
            model.__class__ = VisionTransformer
            del model.token_sizes
        return model
    for block in blocks:
        block.__class__ = MergingBlock
        block.merge_r, block.num_prefix = r, model.config.num_prefix_tokens
    model.__class__ = MergingVisionTransformer
    model.token_sizes = None
    return model
