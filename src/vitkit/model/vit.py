"""The Vision Transformer, written to read like eq. 1-4 of the paper."""

from __future__ import annotations

import torch
from torch import nn

from vitkit.config import ViTConfig
from vitkit.errors import ConfigError, InputError
from vitkit.model.info import ModelInfo, ModelInfoAttributes
from vitkit.model.init import init_weights_
from vitkit.model.layers import Block
from vitkit.model.posembed import fixed_positions, resample_grid_embed
from vitkit.model.stems import Stem, build_stem
from vitkit.model.timm_api import TimmModelAPI, pool_from_timm


class PreLogits(nn.Module):
    """The paper's pre-training head hidden layer: Linear followed by tanh."""

    def __init__(self, width: int, dim: int) -> None:
        super().__init__()
        self.fc = nn.Linear(width, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.tanh(self.fc(x))


class VisionTransformer(TimmModelAPI, ModelInfoAttributes, nn.Module):
    """ViT: patches -> tokens (+ class token, + positions) -> L encoder blocks -> head.

    `forward_features` returns the final token states (B, T, D); `forward_head` pools them
    (class token or a mean), applies the optional pre-logits layer and the classifier.
    Pass `return_attention=True` to get each layer's attention weights (B, heads, T, T)
    from the explicit attention path; the default path is the fused SDPA kernel.

    Image size: by default forward takes `config.img_size` only (`set_image_size` changes
    it). With `config.dynamic_img_size` (or `set_dynamic_img_size()`), forward takes any size
    the stem accepts (`Stem.check_size`) and fits the positions to each input's token grid as
    `set_image_size(size, "bilinear")` would: learned ones resampled bilinearly, sin-cos
    tables rebuilt. The stored positions stay those of `config.img_size`.
    """

    def __init__(self, config: ViTConfig) -> None:
        super().__init__()
        # What loaded weights say about the model (`vitkit.model.info`; filled by
        # `vitkit.weights.build_model`): preprocess, class_names, task, origin, ... read it.
        self.info = ModelInfo()
        self.config = config
        width = config.width
        self.patch_embed = build_stem(config)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, width)) if config.class_token else None
        self.pos_embed = self._make_pos_embed(config)
        self.pos_drop = nn.Dropout(config.dropout)
        drop_path = [config.drop_path * i / max(config.depth - 1, 1) for i in range(config.depth)]
        approximate = "tanh" if config.act == "gelu_tanh" else "none"
        self.blocks = nn.ModuleList(
            Block(width, config.num_heads, config.mlp_dim, config.qkv_bias, config.dropout,
                  config.attn_dropout, rate, approximate, config.norm_eps)
            for rate in drop_path)
        use_norm = config.final_norm != "none"
        self.norm = nn.LayerNorm(width, eps=config.norm_eps) if use_norm and \
            config.final_norm == "tokens" else nn.Identity()
        self.fc_norm = nn.LayerNorm(width, eps=config.norm_eps) if use_norm and \
            config.final_norm == "pooled" else nn.Identity()
        self.pre_logits = PreLogits(width, config.pre_logits_dim) if config.pre_logits_dim \
            else nn.Identity()
        self.head = self._make_head(config.pre_logits_dim or width, config.num_classes)
        init_weights_(self, config.init)
        self.grad_checkpointing = False  # see set_grad_checkpointing

    @staticmethod
    def _make_pos_embed(config: ViTConfig) -> torch.Tensor | None:
        if config.pos_embed == "learned":
            return nn.Parameter(torch.zeros(1, config.seq_len, config.width))
        if config.pos_embed == "none":
            return None
        table = fixed_positions(config.pos_embed, config.grid_size, config.num_prefix_tokens,
                                config.width)
        return nn.Buffer(table, persistent=False)

    @staticmethod
    def _make_head(in_features: int, num_classes: int) -> nn.Module:
        return nn.Linear(in_features, num_classes) if num_classes > 0 else nn.Identity()

    # -- eq. 1 ------------------------------------------------------------------------------
    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """z0 = [x_class; x_p E] + E_pos."""
        self.check_input(images)
        if self.config.dynamic_img_size:
            step = self.patch_embed.size_step
            if torch.jit.is_tracing() and step > 1:  # exported: no check_size; fail, not crop
                images = whole_steps(images, step)
            features = self.patch_embed.feature_map(images)
            positions = self.positions((features.shape[-2], features.shape[-1]))
            tokens = features.flatten(2).transpose(1, 2).contiguous()  # see Stem.forward
        else:
            tokens, positions = self.patch_embed(images), self.pos_embed
        if self.cls_token is not None:
            tokens = torch.cat([self.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        if positions is not None:
            tokens = tokens + positions
        return self.pos_drop(tokens)

    def positions(self, grid: tuple[int, int]) -> torch.Tensor | None:
        """E_pos for a token grid: the stored table at the model's own grid; for another grid,
        learned positions resampled bilinearly (align_corners=False, the class token's row
        kept) and fixed tables rebuilt, as `set_image_size(size, "bilinear")` does."""
        config, stored = self.config, self.pos_embed
        if stored is None or (not torch.jit.is_tracing() and tuple(grid) == config.grid_size):
            return stored
        if isinstance(stored, nn.Parameter):
            return resample_grid_embed(stored, config.grid_size, grid, config.num_prefix_tokens,
                                       mode="bilinear")
        table = fixed_positions(config.pos_embed, grid, config.num_prefix_tokens, config.width)
        return table.to(stored.device, stored.dtype)

    # -- eq. 2-3 and the final LayerNorm of eq. 4 ----------------------------------------------
    def forward_features(self, images: torch.Tensor, return_attention: bool = False
                         ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Token states after the encoder (and its final LayerNorm when it acts on tokens)."""
        x = self.embed(images)
        attentions = []
        for block in self.blocks:
            x, weights = self.call_block(block, x, return_attention)
            if return_attention:
                attentions.append(weights)
        x = self.norm(x)
        return (x, attentions) if return_attention else x

    # -- eq. 4 and the head -------------------------------------------------------------------
    def pool(self, tokens: torch.Tensor) -> torch.Tensor:
        """The image representation: the class token, or a mean over tokens."""
        pool = self.config.pool
        if pool == "class_token":
            return tokens[:, 0]
        if pool == "mean_patches":
            return tokens[:, self.config.num_prefix_tokens:].mean(dim=1)
        return tokens.mean(dim=1)

    def forward_head(self, tokens: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        """Pool, normalise (if the norm acts after pooling), pre-logits layer, classifier."""
        x = self.pre_logits(self.fc_norm(self.pool(tokens)))
        return x if pre_logits else self.head(x)

    def forward(self, images: torch.Tensor, return_attention: bool = False
                ) -> torch.Tensor | tuple[torch.Tensor, list[torch.Tensor]]:
        """Logits (B, num_classes); with `return_attention`, also the per-layer attentions.

        A model that pools its class token needs only that token out of the last block, so
        forward computes the last block for the class token alone (every token still serves
        as key and value): the same logits as `forward_head(forward_features(x))`, with the
        last layer's MLP, projection and attention run for one token instead of all.
        """
        if return_attention:
            tokens, attentions = self.forward_features(images, return_attention=True)
            return self.forward_head(tokens), attentions
        if self.pools_class_token_only():
            x = self.embed(images)
            for block in self.blocks[:-1]:
                x, _ = self.call_block(block, x)
            return self.forward_head(self.norm(self.call_block(self.blocks[-1].forward_first, x)))
        return self.forward_head(self.forward_features(images))

    def pools_class_token_only(self) -> bool:
        """Whether forward takes the class-token shortcut: the class-token pool over vitkit's
        own blocks (token merging has its own: `MergingVisionTransformer`; a user's
        replacement has none), and no hook on the last block or the final norm."""
        return (type(self).forward_features is VisionTransformer.forward_features
                and all(type(block) is Block for block in self.blocks)
                and self.class_token_alone_suffices())

    def class_token_alone_suffices(self) -> bool:
        """Whether the model's output needs the class token alone out of the last block: the
        class-token pool, and no hook on the last block or the final norm (a hook there
        expects every token)."""
        if not (self.config.pool == "class_token" and self.cls_token is not None
                and len(self.blocks) > 0):
            return False
        watched = [*self.blocks[-1].modules(), *self.norm.modules()]
        return not any(module._forward_hooks or module._forward_pre_hooks for module in watched)

    # -- the head (timm's other calls: `TimmModelAPI`) --------------------------------------------
    def reset_classifier(self, num_classes: int, global_pool: str | None = None, *,
                         drop_pre_logits: bool = True, zero_init: bool | None = None) -> None:
        """Replace the head with a new one of `num_classes` outputs (0: features only).

        `global_pool`, as timm's, changes the pooling: timm's "token" or "avg" (see
        `TIMM_POOLS`) or a `config.pool` name; None keeps it. The final norm stays where it
        is, as in timm. As in the paper's fine-tuning, the pre-logits layer is dropped by
        default. The new head starts at zero with `zero_init=True` (the paper's fine-tuning),
        trunc-normal(0.02) with False, and by default as the model's init scheme does (zero
        for "jax").
        """
        if global_pool is not None:
            self.config = self.config.replace(pool=pool_from_timm(global_pool))
        if num_classes != self.config.num_classes:  # what described the old head's outputs
            self.info = self.info.for_new_head()
        if drop_pre_logits and self.config.pre_logits_dim:
            self.pre_logits = nn.Identity()
            self.config = self.config.replace(pre_logits_dim=0)
        self.config = self.config.replace(num_classes=num_classes)
        reference = next(p for p in self.parameters() if p.is_floating_point())
        self.head = self._make_head(self.head_hidden_size, num_classes).to(
            reference.device, reference.dtype).train(self.training)
        if isinstance(self.head, nn.Linear):
            with torch.no_grad():
                if zero_init or (zero_init is None and self.config.init == "jax"):
                    nn.init.zeros_(self.head.weight)
                else:
                    nn.init.trunc_normal_(self.head.weight, std=0.02, a=-0.04, b=0.04)
                nn.init.zeros_(self.head.bias)

    # -- utilities ------------------------------------------------------------------------------
    @torch.no_grad()
    def set_image_size(self, img_size: int | tuple[int, int], mode: str = "bicubic",
                       align_corners: bool = False, antialias: bool = False) -> None:
        """Take images of another size from now on (the patch size stays).

        Learned position embeddings are resampled to the new grid in place (the same
        Parameter, so optimizers keep tracking it) with `resample_grid_embed(mode,
        align_corners, antialias)`; fixed sin-cos tables are rebuilt. `preprocess` takes the
        new size too, as `save_pretrained` writes it.
        """
        old, new = self.config, self.config.replace(img_size=img_size)
        if new.grid_size != old.grid_size and self.pos_embed is not None:
            if isinstance(self.pos_embed, nn.Parameter):
                self.pos_embed.data = resample_grid_embed(self.pos_embed.data, old.grid_size,
                                                          new.grid_size, old.num_prefix_tokens,
                                                          mode, antialias, align_corners)
            else:
                table = self._make_pos_embed(new)
                self.pos_embed = nn.Buffer(table.data.to(self.pos_embed.device),
                                           persistent=False)
        self.config = new
        if self.preprocess is not None:
            self.preprocess = self.preprocess.replace(img_size=list(new.img_size))

    def set_dynamic_img_size(self, enabled: bool = True) -> None:
        """Let forward take any image size the stem accepts (positions fitted per input), or
        only `config.img_size` again (`enabled=False`)."""
        if enabled:
            if not isinstance(self.patch_embed, Stem):
                raise ConfigError(f"a dynamic image size needs a stem from vitkit.model.stems "
                                  f"that knows its token grid, not a "
                                  f"{type(self.patch_embed).__name__}; keep the fixed size.")
            expected = (1, self.config.seq_len, self.config.width)
            if self.pos_embed is not None and tuple(self.pos_embed.shape) != expected:
                raise ConfigError(f"the position embedding has shape "
                                  f"{tuple(self.pos_embed.shape)}, not {expected} from the "
                                  "config, so it cannot be fitted to other grids; keep the "
                                  "fixed size.")
        self.config = self.config.replace(dynamic_img_size=enabled)

    def check_input(self, images: torch.Tensor) -> None:
        """Refuse a tensor whose rank, channels or size do not fit, saying how to fix it."""
        cfg = self.config
        if not isinstance(images, torch.Tensor):
            raise InputError(
                f"expected a tensor of images shaped (batch, channels, height, width), got a "
                f"{type(images).__name__}: make one from PIL images with "
                "vitkit.preprocess.preprocess_for(model)(images), which resizes and normalises "
                "them as the model expects (a numpy array: torch.from_numpy(array))")
        if images.dim() != 4:
            hint = " Add a batch dimension with images.unsqueeze(0)." if images.dim() == 3 else ""
            raise InputError(f"expected images shaped (batch, channels, height, width), got a "
                             f"tensor of rank {images.dim()} with shape {tuple(images.shape)}."
                             + hint)
        self._check_dtype(images)
        channels, height, width = images.shape[1:]
        if channels != cfg.in_chans and width == cfg.in_chans:
            raise InputError(
                f"the images are channels-last (NHWC, shape {tuple(images.shape)}: "
                f"{width} channel(s) last), but the model takes channels before height and "
                "width (NCHW): pass x.permute(0, 3, 1, 2)")
        if channels != cfg.in_chans:
            raise InputError(
                f"the model expects {cfg.in_chans} input channel(s) but got {channels} (shape "
                f"{tuple(images.shape)}). Convert the images (e.g. to RGB) or build the model "
                f"with in_chans={channels}. Channels come before height and width (NCHW).")
        if cfg.dynamic_img_size:
            if not torch.jit.is_tracing():  # traced sizes are tensors; the graph takes any
                self.patch_embed.check_size((height, width))
        elif (height, width) != cfg.img_size:
            patch = cfg.patch_size
            if height % patch or width % patch:
                problem = (f"image size {height}x{width} is not divisible by patch size {patch}")
            else:
                problem = f"image size {height}x{width} differs from the model's"
            raise InputError(
                f"{problem}: the model was built for {cfg.img_size[0]}x{cfg.img_size[1]} images. "
                f"Resize the images to {cfg.img_size[0]}x{cfg.img_size[1]}, or create the model "
                f"with img_size=({height - height % patch or patch}, "
                f"{width - width % patch or patch}) (position embeddings of pretrained weights "
                "are resampled on load), or call model.set_dynamic_img_size() to take any "
                "size the stem accepts.")

    def _check_dtype(self, images: torch.Tensor) -> None:
        """Refuse integer pixels (not normalised yet) and floats of another type than the
        weights' outside autocast, where torch's error speaks of bias types."""
        if not images.is_floating_point():
            pixels = "images" if images.dtype == torch.uint8 else "images.to(torch.uint8)"
            raise InputError(
                f"the images are {images.dtype}, not normalised floats: normalise them as the "
                f"model expects with vitkit.preprocess.preprocess_for(model).normalize({pixels}) "
                "(0-255 pixels to the model's mean and std)")
        weights = next(self.parameters()).dtype
        if images.dtype != weights and not torch.is_autocast_enabled(images.device.type):
            raise InputError(f"the images are {images.dtype} but the model's weights are "
                             f"{weights}: call images.to({weights}) (or model.to(the images' "
                             "dtype))")

    def no_weight_decay(self) -> set[str]:
        """Parameter names that weight decay should skip (tokens and positions)."""
        return {"cls_token", "pos_embed"}


def whole_steps(images: torch.Tensor, step: int) -> torch.Tensor:
    """`images` unchanged, through a reshape into (height / step, step, width / step, step)
    blocks that fails where a side is not a multiple of `step`. In a traced (ONNX) graph of a
    dynamic-size model this is the size check: its Reshape refuses such an input, where the
    stem's strided convolution would drop the remainder silently."""
    batch, channels, height, width = images.shape
    blocks = images.reshape(batch, channels, height // step, step, width // step, step)
    return blocks.reshape(batch, channels, height, width)
