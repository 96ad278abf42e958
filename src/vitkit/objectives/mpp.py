"""Masked patch prediction: the paper's own self-supervised objective (Dosovitskiy et al. 2021,
Section 4.6 and Appendix B.1.2).

Corrupt a share of the patch embeddings (`mask_prob`, 50% in the paper); of the corrupted
ones, `replace_prob` (80%) become a learnable [mask] embedding, `random_prob` (10%) a random
other patch embedding, the rest (10%) stay as they are. Each corrupted patch then predicts,
from its output token, a target made of its own pixels; the loss counts corrupted patches only.

Targets (`MPPConfig.target`):
  "mean_color"  the patch's mean colour, each channel quantised to 2**bits levels and the three
                combined into one class: 3 bits -> 512 classes (the paper's main choice)
  "downsized"   the patch averaged to `downsized` x `downsized` cells, each cell's colour a
                class as above: 16 predictions of 512 classes for 4 x 4
  "pixels"      the full patch in [0, 1] pixels, regressed with a mean squared error (L2)

The rules this module chooses (the paper does not say):
  - count: exactly max(1, floor(N * mask_prob + 1/2)) of an image's N patches are corrupted
    (round half up), the ones with the smallest of N uniform draws (argsort of noise);
  - among those, each patch independently becomes [mask] with probability `replace_prob`, a
    random other patch with `random_prob`, else stays (so the 80/10/10 split is binomial);
  - a random replacement is the uncorrupted embedding of another position of the same image,
    uniform over the N - 1 others (a one-patch image has none: its patch stays as it is);
  - corruption acts on the patch embeddings x_p E, before the class token and the position
    embeddings are added (eq. 1): a replaced patch keeps its own position, so the model knows
    where it must predict.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from vitkit.errors import ConfigError
from vitkit.model.vit import VisionTransformer

MPP_TARGETS = ("mean_color", "downsized", "pixels")
OFFICIAL_MEAN = (0.5, 0.5, 0.5)  # the official checkpoints' input scaling: (x - 0.5) / 0.5
OFFICIAL_STD = (0.5, 0.5, 0.5)
# A quantised level is floor(value * levels + LEVEL_TOLERANCE): a mean that lies on a level's
# edge in exact arithmetic (0.5 for a half black, half white patch) lands on the upper level
# even after float rounding has put it a hair below.
LEVEL_TOLERANCE = 1e-4


@dataclass(frozen=True)
class MPPConfig:
    """The settings of masked patch prediction; the defaults are the paper's."""

    mask_prob: float = 0.5  # share of patches corrupted per image, in (0, 1)
    replace_prob: float = 0.8  # of the corrupted: share replaced by the [mask] embedding
    random_prob: float = 0.1  # of the corrupted: share replaced by another patch's embedding
    target: str = "mean_color"  # one of MPP_TARGETS
    bits: int = 3  # colour bits per channel: 2**(3 * bits) classes per prediction
    downsized: int = 4  # cells per side of the "downsized" target

    def __post_init__(self) -> None:
        for key in ("mask_prob", "replace_prob", "random_prob"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{key} must be a number, got {value!r}")
        if not 0.0 < self.mask_prob < 1.0:  # NaN fails too
            raise ConfigError(f"mask_prob={self.mask_prob} must be in (0, 1), both ends "
                              "excluded: it is the share of patches corrupted (the paper's "
                              "0.5); with none corrupted there is nothing to predict, with all "
                              "nothing to predict from")
        for key in ("replace_prob", "random_prob"):
            if not 0.0 <= getattr(self, key) <= 1.0:
                raise ConfigError(f"{key}={getattr(self, key)} must be in [0, 1]: it is a "
                                  "share of the corrupted patches (the paper's replace_prob "
                                  "0.8, random_prob 0.1)")
        if self.replace_prob + self.random_prob > 1.0 + 1e-9:
            raise ConfigError(f"replace_prob + random_prob = {self.replace_prob} + "
                              f"{self.random_prob} exceeds 1: they share the corrupted patches "
                              "(the rest stay as they are); make them sum to at most 1, e.g. "
                              "0.8 and 0.1")
        if self.target not in MPP_TARGETS:
            raise ConfigError(f"target={self.target!r} is not one of {', '.join(MPP_TARGETS)}")
        if isinstance(self.bits, bool) or not isinstance(self.bits, int) \
                or not 1 <= self.bits <= 8:
            raise ConfigError(f"bits={self.bits!r} must be an integer in [1, 8]: the colour "
                              "bits per channel (the paper's 3, 512 colours)")
        if isinstance(self.downsized, bool) or not isinstance(self.downsized, int) \
                or self.downsized < 1:
            raise ConfigError(f"downsized={self.downsized!r} must be a positive integer: the "
                              "cells per side of the downsized patch (the paper's 4)")

    @property
    def num_colors(self) -> int:
        """Classes of one colour prediction: 2**bits levels for each of R, G and B."""
        return 2 ** (3 * self.bits)


def corrupted_count(num_patches: int, mask_prob: float) -> int:
    """How many of `num_patches` one image has corrupted: floor(N * p + 1/2), at least 1."""
    return min(num_patches, max(1, math.floor(num_patches * mask_prob + 0.5)))


def corrupt(patch_tokens: torch.Tensor, mask_token: torch.Tensor, cfg: MPPConfig,
            generator: torch.Generator | None = None
            ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Corrupt patch embeddings (B, N, D) as the paper's masked patch prediction does.

    Returns `(corrupted_tokens, corrupted, replaced, random)`: the tokens after corruption
    and three (B, N) boolean masks. `corrupted` marks the chosen patches (exactly
    `corrupted_count(N, cfg.mask_prob)` per image); `replaced` those of them now equal to
    `mask_token` (shape (D,)); `random` those now equal to the original embedding of another
    position of the same image; corrupted patches in neither are left as they are. The
    result is differentiable in `patch_tokens` and `mask_token`.
    """
    batch, count, width = patch_tokens.shape
    device = patch_tokens.device
    chosen = corrupted_count(count, cfg.mask_prob)
    noise = torch.rand(batch, count, generator=generator, device=device)
    picked = noise.argsort(dim=1)[:, :chosen]
    corrupted = torch.zeros(batch, count, dtype=torch.bool, device=device)
    corrupted.scatter_(1, picked, True)

    draw = torch.rand(batch, count, generator=generator, device=device)
    replaced = corrupted & (draw < cfg.replace_prob)
    random = corrupted & ~replaced & (draw < cfg.replace_prob + cfg.random_prob)
    if count > 1:  # another position, uniform over the N - 1 others
        other = torch.randint(0, count - 1, (batch, count), generator=generator, device=device)
        other = other + (other >= torch.arange(count, device=device)).long()
        donors = patch_tokens.gather(1, other.unsqueeze(-1).expand(-1, -1, width))
    else:  # one patch: no other to take, it stays as it is
        random = torch.zeros_like(random)
        donors = patch_tokens

    tokens = torch.where(random.unsqueeze(-1), donors, patch_tokens)
    tokens = torch.where(replaced.unsqueeze(-1), mask_token.reshape(1, 1, width).to(tokens.dtype),
                         tokens)
    return tokens, corrupted, replaced, random


def check_rgb(channels: int) -> None:
    """Refuse colour targets for images that are not RGB, saying why and what to use."""
    if channels != 3:
        raise ConfigError(
            f"masked patch prediction's colour targets (mean_color, downsized) are classes of "
            f"RGB colours (2**bits levels of red, green and blue), but the images have "
            f"{channels} channel(s), which have no such colours. For such data use the MAE "
            "objective (vitkit.objectives.MaskedAutoencoder), which reconstructs pixels of any "
            "channel count, or MPPConfig(target='pixels').")


def to_pixels(images: torch.Tensor, mean: Sequence[float], std: Sequence[float]
              ) -> torch.Tensor:
    """Normalised images (B, C, H, W) back to [0, 1] pixels: x * std + mean, clamped."""
    shape = (1, -1, 1, 1)
    m = torch.as_tensor(mean, dtype=torch.float32, device=images.device).view(shape)
    s = torch.as_tensor(std, dtype=torch.float32, device=images.device).view(shape)
    if m.shape[1] != images.shape[1] or s.shape[1] != images.shape[1]:
        raise ConfigError(f"the images have {images.shape[1]} channel(s) but mean/std have "
                          f"{m.shape[1]}/{s.shape[1]}: give one mean and std per channel, those "
                          "the images were normalised with (the model's Preprocess)")
    return (images.float() * s + m).clamp(0.0, 1.0)


def color_targets(images: torch.Tensor, patch_size: int, bits: int = 3,
                  mean: Sequence[float] = OFFICIAL_MEAN, std: Sequence[float] = OFFICIAL_STD,
                  downsized: int | None = None) -> torch.Tensor:
    """Colour classes of each patch of normalised RGB images (B, 3, H, W).

    The images are taken back to [0, 1] pixels with `mean` and `std` (those they were
    normalised with). A colour is quantised per channel to level
    floor(value * 2**bits) (1.0 goes to the top level 2**bits - 1) and the three levels are
    combined as R * 4**bits + G * 2**bits + B: for 3 bits R*64 + G*8 + B in [0, 512), pure red
    448, white 511. Without `downsized`: the mean colour of each patch, (B, N) with patches
    in row-major order. With `downsized=d`: each patch averaged to d x d cells (d must divide
    the patch size), (B, N, d*d), the cells in row-major order within the patch.
    """
    check_rgb(images.shape[1])
    cells = 1 if downsized is None else downsized
    if cells < 1 or patch_size % cells:
        raise ConfigError(f"downsized={downsized} must divide the patch size {patch_size}: "
                          "each cell averages patch_size / downsized pixels per side")
    pixels = to_pixels(images, mean, std)
    batch, _, height, width = pixels.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    pixels = pixels[:, :, :grid_h * patch_size, :grid_w * patch_size]
    averaged = F.avg_pool2d(pixels, patch_size // cells)  # (B, 3, grid_h * d, grid_w * d)
    averaged = averaged.reshape(batch, 3, grid_h, cells, grid_w, cells)
    colors = averaged.permute(0, 2, 4, 3, 5, 1).reshape(batch, grid_h * grid_w, cells * cells, 3)
    levels = 2 ** bits
    quantised = (colors * levels + LEVEL_TOLERANCE).floor().clamp(0, levels - 1).long()
    classes = (quantised[..., 0] * levels + quantised[..., 1]) * levels + quantised[..., 2]
    return classes[..., 0] if downsized is None else classes


def pixel_targets(images: torch.Tensor, patch_size: int, mean: Sequence[float],
                  std: Sequence[float]) -> torch.Tensor:
    """Each patch's [0, 1] pixels flattened channel-major: (B, N, C * P * P), any C."""
    pixels = to_pixels(images, mean, std)
    batch, channels, height, width = pixels.shape
    grid_h, grid_w = height // patch_size, width // patch_size
    pixels = pixels[:, :, :grid_h * patch_size, :grid_w * patch_size]
    patches = pixels.reshape(batch, channels, grid_h, patch_size, grid_w, patch_size)
    return patches.permute(0, 2, 4, 1, 3, 5).reshape(batch, grid_h * grid_w, -1)


def mpp_loss(logits: torch.Tensor, targets: torch.Tensor, corrupted: torch.Tensor,
             target: str = "mean_color") -> torch.Tensor:
    """The loss over the corrupted patches alone: cross-entropy for the colour targets
    (averaged over every prediction of every corrupted patch), the mean squared error for
    "pixels". `logits` (B, N, ...), `targets` (B, N[, ...]), `corrupted` (B, N) bool."""
    chosen_logits, chosen_targets = logits[corrupted], targets[corrupted]
    if target == "pixels":
        return F.mse_loss(chosen_logits.float(), chosen_targets.float())
    return F.cross_entropy(chosen_logits.reshape(-1, chosen_logits.shape[-1]).float(),
                           chosen_targets.reshape(-1))


@dataclass
class MPPOutput:
    """What one masked-patch-prediction pass gives: the loss, the head's outputs for every
    patch ((B, N, classes), (B, N, d*d, classes) or (B, N, C*P*P)), the (B, N) mask of the
    corrupted patches (the only ones the loss counts) and the targets."""

    loss: torch.Tensor
    logits: torch.Tensor
    corrupted: torch.Tensor
    targets: torch.Tensor


class MaskedPatchPrediction(nn.Module):
    """A VisionTransformer pre-trained by masked patch prediction.

    Uses the model's own patch embedding, class token, positions, blocks and final norm (the
    model is held, not copied: training this trains it), plus a learnable [mask] embedding
    and a linear pre-training head on the patch tokens. `preprocess` (anything with `mean`
    and `std`, such as a `vitkit.preprocess.Preprocess`) says how the images were
    normalised; by default the model's own, else the official mean = std = 0.5.

    With `final_norm="pooled"` the model has no norm on tokens, so the head reads the patch
    tokens of the last block as they are.
    """

    def __init__(self, model: VisionTransformer, cfg: MPPConfig | None = None,
                 preprocess: Any = None) -> None:
        super().__init__()
        if not isinstance(model, VisionTransformer):
            raise ConfigError(f"masked patch prediction trains a vitkit VisionTransformer, not "
                              f"a {type(model).__name__}: build one with vitkit.create_model")
        self.cfg = cfg = cfg or MPPConfig()
        config = model.config
        preprocess = preprocess if preprocess is not None else getattr(model, "preprocess",
                                                                       None)
        channels = config.in_chans
        self.mean = tuple(preprocess.mean) if preprocess is not None else (0.5,) * channels
        self.std = tuple(preprocess.std) if preprocess is not None else (0.5,) * channels
        if len(self.mean) != channels or len(self.std) != channels:
            raise ConfigError(f"the preprocess has {len(self.mean)} mean(s) and {len(self.std)} "
                              f"std(s) but the model takes {channels} channel(s): give the "
                              "Preprocess the images were normalised with")
        patch = config.patch_size
        if cfg.target == "pixels":
            outputs = channels * patch * patch
        else:
            check_rgb(channels)
            cells = cfg.downsized if cfg.target == "downsized" else 1
            if patch % cells:
                raise ConfigError(f"downsized={cells} must divide the patch size {patch}: each "
                                  "cell averages patch_size / downsized pixels per side (the "
                                  "paper's 4 for 16 x 16 patches)")
            outputs = cells * cells * cfg.num_colors
        self.encoder = model
        self.mask_token = nn.Parameter(torch.zeros(config.width))
        self.head = nn.Linear(config.width, outputs)
        reference = next(p for p in model.parameters() if p.is_floating_point())
        self.to(reference.device, reference.dtype)
        with torch.no_grad():
            nn.init.trunc_normal_(self.mask_token, std=0.02, a=-0.04, b=0.04)
            nn.init.trunc_normal_(self.head.weight, std=0.02, a=-0.04, b=0.04)
            nn.init.zeros_(self.head.bias)

    def targets(self, images: torch.Tensor) -> torch.Tensor:
        """The targets of every patch of `images` (normalised as the model takes them)."""
        cfg, patch = self.cfg, self.encoder.config.patch_size
        if cfg.target == "pixels":
            return pixel_targets(images, patch, self.mean, self.std)
        downsized = cfg.downsized if cfg.target == "downsized" else None
        return color_targets(images, patch, cfg.bits, self.mean, self.std, downsized)

    def encode(self, images: torch.Tensor, generator: torch.Generator | None = None
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Eq. 1 with corrupted patch embeddings, then eq. 2-3 and the final norm: the patch
        tokens' final states (B, N, D) and the (B, N) mask of the corrupted patches."""
        model = self.encoder
        model.check_input(images)
        if model.config.dynamic_img_size:
            features = model.patch_embed.feature_map(images)
            positions = model.positions((features.shape[-2], features.shape[-1]))
            tokens = features.flatten(2).transpose(1, 2)
        else:
            tokens, positions = model.patch_embed(images), model.pos_embed
        tokens, corrupted, _, _ = corrupt(tokens, self.mask_token, self.cfg, generator)
        if model.cls_token is not None:
            tokens = torch.cat([model.cls_token.expand(tokens.shape[0], -1, -1), tokens], dim=1)
        if positions is not None:
            tokens = tokens + positions
        x = model.pos_drop(tokens)
        for block in model.blocks:
            x, _ = model.call_block(block, x)
        x = model.norm(x)
        return x[:, model.config.num_prefix_tokens:], corrupted

    def forward(self, images: torch.Tensor, generator: torch.Generator | None = None
                ) -> MPPOutput:
        """Corrupt, encode, predict every patch's target; the loss over the corrupted ones."""
        cfg = self.cfg
        tokens, corrupted = self.encode(images, generator)
        logits = self.head(tokens)
        if cfg.target == "downsized":
            logits = logits.unflatten(-1, (cfg.downsized * cfg.downsized, cfg.num_colors))
        with torch.no_grad():
            targets = self.targets(images)
        return MPPOutput(mpp_loss(logits, targets, corrupted, cfg.target), logits, corrupted,
                         targets)
