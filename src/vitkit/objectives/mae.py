"""Masked autoencoder pre-training (He et al., "Masked Autoencoders Are Scalable Vision
Learners", 2021), as Hugging Face's `ViTMAEForPreTraining` computes it.

    patches -> tokens + E_pos -> shuffle by argsort(noise), keep the first (1 - ratio) N
    -> [class token + E_pos[0]; kept tokens] -> the encoder's blocks and final norm
    -> decoder: Linear to its width, mask tokens for the removed patches, unshuffle,
       fixed 2-D sin-cos positions, blocks, LayerNorm, Linear to P*P*C pixels per patch
    -> loss: mean squared error over the removed patches only (optionally of per-patch
       normalised pixels, `norm_pix_loss`)

The encoder is a vitkit `VisionTransformer` used as it is: its patch embedding, positions,
blocks and final norm (its head, if any, is not used). Only the masking step needs the
encoder's pieces one by one, because the class token joins after the masking.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch
from torch import nn

from vitkit.config import ViTConfig
from vitkit.errors import ConfigError, InputError
from vitkit.model import VisionTransformer
from vitkit.model.layers import Block


@dataclass(frozen=True)
class MAEDecoderConfig:
    """The light decoder that reconstructs pixels from the visible tokens.

    The defaults suit small images (CIFAR-sized, a few dozen patches): width 128, depth 2,
    4 heads, MLP 512. The paper's decoder for ImageNet is 512 wide and 8 deep with 16 heads
    (MLP 2048); Hugging Face's `ViTMAEConfig` defaults to that one. The decoder's LayerNorm
    epsilon, activation and qkv bias are the encoder's, as in Hugging Face's model.
    """

    width: int = 128
    depth: int = 2
    num_heads: int = 4
    mlp_dim: int = 512

    def __post_init__(self) -> None:
        for key in ("width", "depth", "num_heads", "mlp_dim"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"MAE decoder {key} must be a positive integer, got {value!r}")
        if self.width % self.num_heads:
            fits = [h for h in range(1, min(self.width, 32) + 1) if self.width % h == 0]
            suggested = self.num_heads * max(1, round(self.width / self.num_heads))
            raise ConfigError(
                f"MAE decoder width {self.width} is not divisible by its {self.num_heads} heads: "
                f"choose num_heads among {fits} or a width that is a multiple of "
                f"{self.num_heads} (e.g. {suggested})")
        if self.width % 4:
            raise ConfigError(f"MAE decoder width must be divisible by 4 (its 2-D sin-cos "
                              f"positions take a quarter each), got {self.width}")


class MAEOutput(NamedTuple):
    """What `MaskedAutoencoder.forward` returns, as `ViTMAEForPreTrainingOutput` means it.

    loss: the scalar reconstruction loss; logits: (B, N, P*P*C) predicted pixels of every
    patch in `patchify` order; mask: (B, N), 1 for a removed (reconstructed) patch and 0 for
    a visible one; ids_restore: (B, N), the position of each patch in the shuffled order.
    """

    loss: torch.Tensor
    logits: torch.Tensor
    mask: torch.Tensor
    ids_restore: torch.Tensor


def mae_sincos_2d(grid_hw: tuple[int, int], width: int) -> torch.Tensor:
    """MAE's fixed 2-D sin-cos table (grid_h * grid_w, width): [sin(x), cos(x), sin(y), cos(y)]
    with x the column and y the row, frequencies 1 / 10000^(i / (width / 4)), rows in raster
    order. The official code's `get_2d_sincos_pos_embed` (and Hugging Face's table); vitkit's
    `sincos_2d` spaces the frequencies as big_vision does (i / (width / 4 - 1)), so differs."""
    if width % 4:
        raise ConfigError(f"MAE's 2-D sin-cos positions need a width divisible by 4, got {width}")
    grid_h, grid_w = grid_hw
    quarter = width // 4
    omega = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float64) / quarter)
    y = torch.arange(grid_h, dtype=torch.float64)[:, None].expand(grid_h, grid_w).flatten()
    x = torch.arange(grid_w, dtype=torch.float64)[None, :].expand(grid_h, grid_w).flatten()
    x_angles, y_angles = x[:, None] * omega[None], y[:, None] * omega[None]
    return torch.cat([x_angles.sin(), x_angles.cos(), y_angles.sin(), y_angles.cos()], 1).float()


def mae_positions(grid_hw: tuple[int, int], width: int, num_prefix_tokens: int) -> torch.Tensor:
    """(1, prefix + grid_h * grid_w, width): zero rows for the prefix (class) token, then
    `mae_sincos_2d`."""
    table = mae_sincos_2d(grid_hw, width)
    return torch.cat([table.new_zeros(num_prefix_tokens, width), table])[None]


@torch.no_grad()
def fix_mae_positions_(encoder: VisionTransformer) -> VisionTransformer:
    """Write MAE's fixed sin-cos table into a learned position embedding and freeze it, as the
    paper's encoder has it (a model built by `create_model` starts with learned ones)."""
    if not isinstance(encoder.pos_embed, nn.Parameter):
        raise ConfigError("fix_mae_positions_ needs an encoder with pos_embed='learned', got "
                          f"pos_embed={encoder.config.pos_embed!r}")
    config = encoder.config
    encoder.pos_embed.copy_(mae_positions(config.grid_size, config.width,
                                          config.num_prefix_tokens))
    encoder.pos_embed.requires_grad_(False)
    return encoder


def random_masking(tokens: torch.Tensor, mask_ratio: float, noise: torch.Tensor | None = None
                   ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Keep a random (1 - mask_ratio) of each image's tokens, by argsort of uniform noise.

    tokens (B, N, D) -> (visible (B, int(N * (1 - mask_ratio)), D), mask (B, N): 1 = removed,
    ids_restore (B, N)). The tokens with the smallest noise are kept, in the order of their
    noise; `ids_restore` undoes the shuffle. `noise` (B, N) fixes the draw (tests, parity).
    The count is truncated, `int(N * (1 - mask_ratio))`, as Hugging Face and MAE compute it.
    """
    batch, length, width = tokens.shape
    keep = int(length * (1 - mask_ratio))
    if noise is None:
        noise = torch.rand(batch, length, device=tokens.device)
    elif tuple(noise.shape) != (batch, length):
        raise InputError(f"noise must be shaped (batch, patches) = ({batch}, {length}), got "
                         f"{tuple(noise.shape)}")
    ids_shuffle = torch.argsort(noise, dim=1).to(tokens.device)
    ids_restore = torch.argsort(ids_shuffle, dim=1)
    ids_keep = ids_shuffle[:, :keep]
    visible = torch.gather(tokens, 1, ids_keep.unsqueeze(-1).expand(-1, -1, width))
    mask = torch.ones(batch, length, device=tokens.device, dtype=tokens.dtype)
    mask[:, :keep] = 0
    return visible, torch.gather(mask, 1, ids_restore), ids_restore


def patchify(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """(B, C, H, W) -> (B, N, P*P*C): patches in raster order, each flattened row by row with
    the channels last (Hugging Face's and MAE's order)."""
    batch, channels, height, width = images.shape
    if height % patch_size or width % patch_size:
        raise InputError(f"image size {height}x{width} is not divisible by patch size "
                         f"{patch_size}")
    grid_h, grid_w = height // patch_size, width // patch_size
    x = images.reshape(batch, channels, grid_h, patch_size, grid_w, patch_size)
    return x.permute(0, 2, 4, 3, 5, 1).reshape(batch, grid_h * grid_w,
                                               patch_size**2 * channels)


def unpatchify(patches: torch.Tensor, patch_size: int, image_size: tuple[int, int]
               ) -> torch.Tensor:
    """The inverse of `patchify`: (B, N, P*P*C) -> (B, C, H, W) for images of `image_size`."""
    height, width = image_size
    grid_h, grid_w = height // patch_size, width // patch_size
    batch, count, values = patches.shape
    channels = values // patch_size**2
    if count != grid_h * grid_w or channels * patch_size**2 != values:
        raise InputError(f"{count} patches of {values} values do not make a {height}x{width} "
                         f"image of {patch_size}x{patch_size} patches ({grid_h * grid_w} patches)")
    x = patches.reshape(batch, grid_h, grid_w, patch_size, patch_size, channels)
    return x.permute(0, 5, 1, 3, 2, 4).reshape(batch, channels, height, width)


class MAEDecoder(nn.Module):
    """Visible tokens + mask tokens, unshuffled, with fixed sin-cos positions -> pixels."""

    def __init__(self, config: MAEDecoderConfig, encoder_config: ViTConfig, out_dim: int
                 ) -> None:
        super().__init__()
        self.config = config
        self.encoder_config = encoder_config
        width = config.width
        self.embed = nn.Linear(encoder_config.width, width)
        self.mask_token = nn.Parameter(torch.zeros(1, 1, width))
        self.num_prefix_tokens = encoder_config.num_prefix_tokens
        self.pos_embed = nn.Buffer(mae_positions(encoder_config.grid_size, width,
                                                 self.num_prefix_tokens))
        approximate = "tanh" if encoder_config.act == "gelu_tanh" else "none"
        self.blocks = nn.ModuleList(
            Block(width, config.num_heads, config.mlp_dim, encoder_config.qkv_bias,
                  approximate=approximate, norm_eps=encoder_config.norm_eps)
            for _ in range(config.depth))
        self.norm = nn.LayerNorm(width, eps=encoder_config.norm_eps)
        self.pred = nn.Linear(width, out_dim)
        self._init_weights()

    @torch.no_grad()
    def _init_weights(self) -> None:
        """The official MAE's: xavier-uniform Linear weights, zero biases, normal(0.02) mask
        token (LayerNorms at one and zero, as built)."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
        nn.init.normal_(self.mask_token, std=0.02)

    def positions(self, grid: tuple[int, int]) -> torch.Tensor:
        """The stored table at the encoder's grid; for another grid (a dynamic-size
        encoder) MAE's table rebuilt for it."""
        if tuple(grid) == tuple(self.encoder_config.grid_size):
            return self.pos_embed
        table = mae_positions(grid, self.config.width, self.num_prefix_tokens)
        return table.to(self.pos_embed.device, self.pos_embed.dtype)

    def forward(self, latent: torch.Tensor, ids_restore: torch.Tensor,
                grid: tuple[int, int]) -> torch.Tensor:
        """latent (B, prefix + visible, D_enc) -> logits (B, N, P*P*C), prefix dropped."""
        prefix = self.num_prefix_tokens
        x = self.embed(latent)
        batch, length = ids_restore.shape
        masked = self.mask_token.expand(batch, length + prefix - x.shape[1], -1)
        patches = torch.cat([x[:, prefix:], masked], dim=1)
        index = ids_restore.unsqueeze(-1).expand(-1, -1, x.shape[2]).to(patches.device)
        x = torch.cat([x[:, :prefix], torch.gather(patches, 1, index)], dim=1)
        x = x + self.positions(grid)
        for block in self.blocks:
            x, _ = block(x)
        return self.pred(self.norm(x))[:, prefix:]


class MaskedAutoencoder(nn.Module):
    """MAE pre-training around a vitkit encoder: `forward(images, noise=None) -> MAEOutput`.

    `mask_ratio` is the fraction of patches removed, in (0, 1) (the paper: 0.75);
    `norm_pix_loss` reconstructs each patch's pixels normalised by their own mean and
    variance (eps 1e-6), the paper's better-representations option. The encoder's
    positions are used as it holds them: `fix_mae_positions_` gives a new encoder MAE's
    fixed sin-cos table. After pre-training, `model.encoder` is the ViT to fine-tune.
    """

    def __init__(self, encoder: VisionTransformer, decoder: MAEDecoderConfig | None = None,
                 mask_ratio: float = 0.75, norm_pix_loss: bool = False) -> None:
        super().__init__()
        if isinstance(mask_ratio, bool) or not isinstance(mask_ratio, (int, float)) \
                or not 0.0 < mask_ratio < 1.0:
            raise ConfigError(f"mask_ratio must be in (0, 1), the fraction of patches removed "
                              f"(the paper uses 0.75), got {mask_ratio!r}")
        config = encoder.config
        if config.final_norm == "pooled":
            raise ConfigError("MAE's decoder reads the normalised tokens of the encoder: build "
                              "the encoder with final_norm='tokens', not 'pooled'")
        self.encoder = encoder
        self.decoder_config = decoder or MAEDecoderConfig()
        self.mask_ratio = float(mask_ratio)
        self.norm_pix_loss = bool(norm_pix_loss)
        self.patch_size = config.patch_size
        self.decoder = MAEDecoder(self.decoder_config, config,
                                  config.patch_size**2 * config.in_chans)

    # -- the encoder on the visible patches -----------------------------------------------------
    def forward_encoder(self, images: torch.Tensor, noise: torch.Tensor | None = None
                        ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, tuple[int, int]]:
        """(latent (B, prefix + visible, D), mask, ids_restore, token grid): positions added
        to the patches, masking, then the class token with its position, as HF orders it."""
        encoder = self.encoder
        encoder.check_input(images)
        features = encoder.patch_embed.feature_map(images)
        grid = (features.shape[-2], features.shape[-1])
        tokens = features.flatten(2).transpose(1, 2)
        positions = encoder.positions(grid)
        prefix = encoder.config.num_prefix_tokens
        if positions is not None:
            tokens = tokens + positions[:, prefix:]
        tokens, mask, ids_restore = random_masking(tokens, self.mask_ratio, noise)
        if encoder.cls_token is not None:
            cls = encoder.cls_token if positions is None else \
                encoder.cls_token + positions[:, :prefix]
            tokens = torch.cat([cls.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        x = encoder.pos_drop(tokens)
        for block in encoder.blocks:
            x, _ = encoder.call_block(block, x)
        return encoder.norm(x), mask, ids_restore, grid

    # -- the loss ------------------------------------------------------------------------------
    def patchify(self, images: torch.Tensor) -> torch.Tensor:
        return patchify(images, self.patch_size)

    def unpatchify(self, patches: torch.Tensor, image_size: tuple[int, int] | None = None
                   ) -> torch.Tensor:
        return unpatchify(patches, self.patch_size,
                          tuple(image_size or self.encoder.config.img_size))

    def reconstruction_loss(self, images: torch.Tensor, logits: torch.Tensor,
                            mask: torch.Tensor) -> torch.Tensor:
        """Mean squared error per patch, averaged over the removed patches."""
        target = self.patchify(images)
        if self.norm_pix_loss:
            mean = target.mean(dim=-1, keepdim=True)
            var = target.var(dim=-1, keepdim=True)
            target = (target - mean) / (var + 1.0e-6) ** 0.5
        per_patch = ((logits - target) ** 2).mean(dim=-1)
        return (per_patch * mask).sum() / mask.sum()

    def forward(self, images: torch.Tensor, noise: torch.Tensor | None = None) -> MAEOutput:
        latent, mask, ids_restore, grid = self.forward_encoder(images, noise)
        logits = self.decoder(latent, ids_restore, grid)
        return MAEOutput(self.reconstruction_loss(images, logits, mask), logits, mask,
                         ids_restore)
