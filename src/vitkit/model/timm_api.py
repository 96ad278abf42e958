"""timm's model API on `VisionTransformer`, with timm's semantics: the widths and the
attributes code written for timm reads (`num_classes`, `global_pool`, `num_prefix_tokens`,
`feature_info`, ...), the classifier, gradient checkpointing, `forward_intermediates`,
`get_intermediate_layers` and `prune_intermediate_layers`, and `pretrained_cfg`
(tests/model/test_timm_model_api.py checks each against timm)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from vitkit.config import POOLS, TIMM_POOLS
from vitkit.errors import ConfigError
from vitkit.preprocess import preprocess_for

INTERMEDIATE_FORMATS = ("NCHW", "NLC")  # forward_intermediates: token maps or token lists


class TimmModelAPI:
    """The calls a timm user makes on a ViT; mixed into `VisionTransformer`, whose
    attributes (config, blocks, norm, head, patch_embed, info) they read."""

    grad_checkpointing: bool = False  # see set_grad_checkpointing

    @property
    def embed_dim(self) -> int:
        """The token width D (timm's name)."""
        return self.config.width

    @property
    def num_features(self) -> int:
        """The width of the features the head pools: D, as timm's `num_features`."""
        return self.config.width

    @property
    def head_hidden_size(self) -> int:
        """The width the classifier sees, `forward_head(x, pre_logits=True)`'s: the
        pre-logits layer's when there is one, else D (timm's `head_hidden_size`)."""
        return self.config.pre_logits_dim or self.config.width

    @property
    def num_classes(self) -> int:
        """The classifier's outputs (0: features only)."""
        return self.config.num_classes

    @property
    def global_pool(self) -> str:
        """timm's name of the pooling: "token" (the class token), "avg" (the mean of the patch
        tokens), else vitkit's own (`config.pool`: "mean_all_tokens" has no timm name)."""
        timm_names = {pool: name for name, pool in TIMM_POOLS.items()}
        return timm_names.get(self.config.pool, self.config.pool)

    @property
    def num_prefix_tokens(self) -> int:
        """Tokens before the patch tokens: 1 with a class token, else 0."""
        return self.config.num_prefix_tokens

    @property
    def has_class_token(self) -> bool:
        return self.config.class_token

    @property
    def no_embed_class(self) -> bool:
        """False, as timm's default: the position table has a row for the class token."""
        return False

    @property
    def dynamic_img_size(self) -> bool:
        """Whether the model reads images of other sizes (positions resampled per call)."""
        return self.config.dynamic_img_size

    @property
    def feature_info(self) -> list[dict[str, Any]]:
        """timm's description of the features each block gives: its module, width and
        reduction (input pixels per token along a side)."""
        reduction = self.config.img_size[0] // self.config.grid_size[0]
        return [{"module": f"blocks.{index}", "num_chs": self.config.width,
                 "reduction": reduction} for index in range(len(self.blocks))]

    def get_classifier(self) -> nn.Module:
        """The classifier: a Linear, or Identity for a features-only model."""
        return self.head

    def set_grad_checkpointing(self, enable: bool = True) -> None:
        """Recompute each block's activations in the backward pass instead of keeping them
        (less memory for about one more forward pass), as timm's does."""
        self.grad_checkpointing = enable

    def call_block(self, block_call: Callable[..., Any], *args: Any) -> Any:
        """`block_call(*args)`: checkpointed (non-reentrant) when gradient checkpointing is
        on and autograd is recording."""
        if self.grad_checkpointing and torch.is_grad_enabled():
            return checkpoint(block_call, *args, use_reentrant=False)
        return block_call(*args)

    def forward_intermediates(self, images: torch.Tensor,
                              indices: int | Sequence[int] | None = None,
                              return_prefix_tokens: bool = False, norm: bool = False,
                              stop_early: bool = False, output_fmt: str = "NCHW",
                              intermediates_only: bool = False, output_dict: bool = False
                              ) -> Any:
        """timm's feature API: the final token states and the outputs of chosen blocks.

        `indices`: the last n blocks (an int), those listed (negative: from the end), or all
        (None). Each intermediate is a block's output (through the final token norm when
        `norm`) without its prefix tokens: a (B, D, H, W) map over the token grid ("NCHW")
        or (B, N, D) ("NLC"); with `return_prefix_tokens`, a (patches, prefix) pair.
        Returns (final tokens, intermediates), the list alone with `intermediates_only`, or
        with `output_dict` timm's dict ("image_intermediates", "image_features",
        "image_intermediates_prefix"). `stop_early` runs no block after the last one taken.
        """
        if output_fmt not in INTERMEDIATE_FORMATS:
            raise ConfigError(f"output_fmt={output_fmt!r} is not one of "
                              f"{', '.join(INTERMEDIATE_FORMATS)}")
        take, last = feature_indices(len(self.blocks), indices)
        x, states = self.embed(images), []
        for index, block in enumerate(self.blocks[:last + 1] if stop_early else self.blocks):
            x, _ = self.call_block(block, x)
            if index in take:
                states.append(self.norm(x) if norm else x)
        prefix = self.config.num_prefix_tokens
        patches = [state[:, prefix:] for state in states]
        if output_fmt == "NCHW":
            grid = self.token_grid(images)
            patches = [p.reshape(p.shape[0], *grid, -1).permute(0, 3, 1, 2).contiguous()
                       for p in patches]
        prefixes = [state[:, :prefix] for state in states] if prefix else None
        if output_dict:
            found = {"image_intermediates": patches}
            if return_prefix_tokens and prefixes is not None:
                found["image_intermediates_prefix"] = prefixes
            if not intermediates_only:
                found["image_features"] = self.norm(x)
            return found
        if return_prefix_tokens and prefixes is not None:
            patches = list(zip(patches, prefixes, strict=True))
        return patches if intermediates_only else (self.norm(x), patches)

    def get_intermediate_layers(self, images: torch.Tensor,
                                n: int | Sequence[int] = 1, reshape: bool = False,
                                return_prefix_tokens: bool = False, norm: bool = False,
                                attn_mask: torch.Tensor | None = None) -> Any:
        """timm's DINO-style call: the outputs of the last `n` blocks (or those listed),
        (B, N, D), or (B, D, H, W) maps with `reshape`; `forward_intermediates` with
        `intermediates_only`. No attention mask: vitkit's blocks take none."""
        if attn_mask is not None:
            raise ConfigError("get_intermediate_layers(attn_mask=...): vitkit's ViT attends "
                              "over every token and takes no attention mask; leave it None")
        return self.forward_intermediates(images, n, return_prefix_tokens=return_prefix_tokens,
                                          norm=norm, output_fmt="NCHW" if reshape else "NLC",
                                          intermediates_only=True)

    def token_grid(self, images: torch.Tensor) -> tuple[int, int]:
        """The (rows, columns) of patch tokens the model makes of `images`."""
        if self.config.dynamic_img_size:
            return self.patch_embed.token_grid((images.shape[-2], images.shape[-1]))
        return self.config.grid_size

    def prune_intermediate_layers(self, indices: int | Sequence[int] = 1,
                                  prune_norm: bool = False, prune_head: bool = True
                                  ) -> list[int]:
        """Drop what `forward_intermediates(indices=...)` does not need, as timm's does: the
        blocks after the last one taken, the final token norm (`prune_norm`), the pooled norm,
        pre-logits layer and classifier (`prune_head`). The config follows; the pooling stays
        (vitkit has no unpooled head, timm's ""). Returns the block indices taken."""
        take, last = feature_indices(len(self.blocks), indices)
        self.blocks = self.blocks[:last + 1]
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.fc_norm = nn.Identity()
            self.reset_classifier(0)
        final_norm = ("tokens" if not isinstance(self.norm, nn.Identity)
                      else "pooled" if not isinstance(self.fc_norm, nn.Identity) else "none")
        self.config = self.config.replace(depth=last + 1, final_norm=final_norm)
        return take

    @property
    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's description of the input the model expects: a view of the config and the
        model's record `info` (`vitkit.model.info`), made afresh on each read. Its
        preprocessing gives the resize, crop and interpolation (mean and std for 8-bit
        pictures, the scale timm's ToTensor assumes), or without one the official
        preprocessing that predict, eval and save_pretrained then use; its class names the
        label names. Keys vitkit cannot tell (url, license, architecture) are left out.
        Unlike timm's, it follows `set_image_size`."""
        config, pre = self.config, preprocess_for(self)  # the official one when none is set
        cfg: dict[str, Any] = {"input_size": (config.in_chans, *config.img_size),
                               "fixed_input_size": not config.dynamic_img_size}
        squash = pre.resize_mode == "squash"  # timm's "squash": each side to size / crop_pct
        cfg.update(interpolation=pre.interpolation, crop_pct=pre.crop_pct,
                   crop_mode="squash" if squash else "center")
        if pre.scale == 255.0:
            cfg.update(mean=pre.mean, std=pre.std)
        cfg.update(num_classes=config.num_classes, pool_size=None,
                   first_conv=self.first_conv_name(), classifier="head")
        names = self.info.class_names
        if names is not None and len(names) == config.num_classes:
            cfg["label_names"] = tuple(names)
        return cfg

    default_cfg = pretrained_cfg  # timm's older name for it

    def first_conv_name(self) -> str | None:
        """The name of the first convolution, the one that reads the pixels."""
        return next((f"patch_embed.{name}" if name else "patch_embed"
                     for name, module in self.patch_embed.named_modules()
                     if isinstance(module, nn.Conv2d)), None)


def pool_from_timm(global_pool: str) -> str:
    """The `config.pool` for timm's `global_pool` name ("token", "avg"); vitkit's own pool
    names pass through. Anything else is a ConfigError naming the accepted values."""
    if isinstance(global_pool, str) and global_pool in (*TIMM_POOLS, *POOLS):
        return TIMM_POOLS.get(global_pool, global_pool)
    accepted = ", ".join(repr(name) for name in [*TIMM_POOLS, *POOLS])
    hint = (" (drop_pre_logits and zero_init are keyword arguments: "
            "reset_classifier(n, drop_pre_logits=False))" if isinstance(global_pool, bool) else "")
    raise ConfigError(f"global_pool={global_pool!r} is not a pooling vitkit's ViT has; use one "
                      f"of {accepted} (timm's '', 'max', 'avgmax', 'map' and 'prr' have no "
                      f"counterpart){hint}")


def feature_indices(depth: int, indices: int | Sequence[int] | None) -> tuple[list[int], int]:
    """timm's `feature_take_indices`: the blocks to take (the last n for an int, all for None,
    those listed otherwise, negative ones from the end) and the highest of them."""
    if indices is None:
        indices = depth
    if isinstance(indices, int):
        if not 0 < indices <= depth:
            raise ConfigError(f"indices={indices} asks for the last {indices} blocks; the "
                              f"model has {depth}: use 1 to {depth}, or a list of indices")
        take = list(range(depth - indices, depth))
    else:
        take = [index + depth if index < 0 else index for index in indices]
        wrong = [given for given, index in zip(indices, take, strict=True)
                 if not 0 <= index < depth]
        if wrong or not take:
            raise ConfigError(f"block indices {list(indices)} do not fit a model with {depth} "
                              f"blocks: give at least one of 0 to {depth - 1} (or -{depth} to "
                              "-1, from the end)")
    return take, max(take)
