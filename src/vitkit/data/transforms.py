"""Every resize and crop rule of vitkit's data, in one place:

- `InceptionCrop`: the random resized crop of streamed training images;
- `EvalResize`: the evaluation transform of streamed images, `Preprocess.resize` (the shorter
  side to size / crop_pct then a centre crop, or a squash resize);
- `evaluation_preprocess`: which of those a fresh run evaluates with (and records);
- `squash`: the resize of images decoded into memory (`vitkit.data.in_memory`);
- `resize_batch`: a float batch to another size (bilinear, antialiased when shrinking): array
  images, held-out batches at the data's size, progressive resizing in training;
- `to_model_size`: one input at the model's size, the door predict, serve and analysis take
  (a picture through `Preprocess.resize`, the rule checked against timm's and Hugging Face's
  transforms; array images through `resize_batch`), and `stack_images` to batch them.

The per-image transforms take a decoded PIL image at its original resolution and return a
(C, H, W) uint8 array at the model's size; the batched augmentation (`vitkit.data.augment`)
and `resize_batch` do the rest on whole batches.

The Inception crop is the random resized crop of Szegedy et al. (2015) that the paper's
pre-training, big_vision's `inception_crop` and timm's `RandomResizedCrop` use: a window
covering a random fraction `scale` of the image area with a random aspect ratio (log-uniform
in `ratio`), resized to the output size. The window is drawn as torchvision/timm do (ten tries,
then the largest centred window the ratio range allows). Defaults: scale (0.08, 1) and ratio
(3/4, 4/3), timm's and torchvision's; big_vision's default area range is (0.05, 1).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from vitkit.errors import ConfigError
from vitkit.preprocess import INTERPOLATIONS, Preprocess


@dataclass(frozen=True)
class InceptionCrop:
    """A random resized crop to `size` (H, W), with its window drawn from `scale` and `ratio`."""

    size: tuple[int, int]
    scale: tuple[float, float] = (0.08, 1.0)
    ratio: tuple[float, float] = (3 / 4, 4 / 3)
    interpolation: str = "bilinear"

    def __post_init__(self) -> None:
        low, high = self.scale
        if not 0 < low <= high <= 1:
            raise ConfigError(f"crop_scale={list(self.scale)} must be two area fractions "
                              "0 < low <= high <= 1, e.g. [0.08, 1.0]")
        low, high = self.ratio
        if not 0 < low <= high:
            raise ConfigError(f"crop_ratio={list(self.ratio)} must be two aspect ratios "
                              "0 < low <= high, e.g. [0.75, 1.3333]")
        if self.interpolation not in INTERPOLATIONS:
            raise ConfigError(f"interpolation={self.interpolation!r} is not one of "
                              f"{', '.join(INTERPOLATIONS)}")

    def window(self, width: int, height: int, rng: np.random.Generator
               ) -> tuple[int, int, int, int]:
        """(left, top, crop width, crop height) of one random window in a width x height image."""
        area = width * height
        log_low, log_high = math.log(self.ratio[0]), math.log(self.ratio[1])
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(log_low, log_high))
            w = round(math.sqrt(target * aspect))
            h = round(math.sqrt(target / aspect))
            if 0 < w <= width and 0 < h <= height:
                left = int(rng.integers(0, width - w + 1))
                top = int(rng.integers(0, height - h + 1))
                return left, top, w, h
        aspect = width / height  # fallback: the largest centred window within the ratio range
        if aspect < self.ratio[0]:
            w, h = width, round(width / self.ratio[0])
        elif aspect > self.ratio[1]:
            w, h = round(height * self.ratio[1]), height
        else:
            w, h = width, height
        return (width - w) // 2, (height - h) // 2, w, h

    def __call__(self, image: Image.Image, rng: np.random.Generator) -> np.ndarray:
        left, top, w, h = self.window(image.width, image.height, rng)
        out_h, out_w = self.size
        resized = image.resize((out_w, out_h), INTERPOLATIONS[self.interpolation],
                               box=(left, top, left + w, top + h))
        return to_chw(resized)


@dataclass(frozen=True)
class EvalResize:
    """The evaluation transform: `Preprocess.resize` (shorter side to size / crop_pct, then a
    centre crop; or a squash resize), as predict and export apply it."""

    preprocess: Preprocess

    def __call__(self, image: Image.Image, rng: np.random.Generator | None = None) -> np.ndarray:
        return to_chw(self.preprocess.resize(image))


def to_chw(image: Image.Image) -> np.ndarray:
    """A PIL image ("L" or "RGB") as a contiguous (C, H, W) uint8 array."""
    array = np.asarray(image, dtype=np.uint8)
    if array.ndim == 2:
        return array[None].copy()
    return np.ascontiguousarray(array.transpose(2, 0, 1))


def squash(image: Image.Image, size: tuple[int, int]) -> Image.Image:
    """The whole image resized to `size` (H, W), bilinear, no crop: how images are decoded into
    memory (`Preprocess`'s "squash", as the official ViT evaluation resizes)."""
    return image.resize((size[1], size[0]), Image.Resampling.BILINEAR)


def evaluation_preprocess(size: tuple[int, int] | list[int], channels: int, streamed: bool,
                          crop_pct: float) -> Preprocess:
    """The preprocessing of a fresh run at the model's `size` (mean = std = 0.5 per channel).

    Streamed images arrive at full resolution: their shorter side goes to size / `crop_pct`,
    then a centre crop (as ImageNet evaluation does). Images held in memory were decoded at
    one size: they are resized whole (squash).
    """
    half = (0.5,) * channels
    if streamed:
        return Preprocess(img_size=size, resize_mode="shorter_side", crop_pct=crop_pct,
                          mean=half, std=half)
    return Preprocess(img_size=size, mean=half, std=half)


def resize_batch(images: torch.Tensor, size: tuple[int, int] | None) -> torch.Tensor:
    """Resize a float batch to `size` (bilinear, antialiased when shrinking); None keeps it."""
    if size is None or tuple(images.shape[-2:]) == tuple(size):
        return images
    return torch.nn.functional.interpolate(images, size=tuple(size), mode="bilinear",
                                           align_corners=False, antialias=True)


def to_model_size(image: Image.Image | torch.Tensor, preprocess: Preprocess) -> torch.Tensor:
    """One input at the model's size (`preprocess.img_size`): a picture (PIL) through
    `Preprocess.resize` (its resize mode, crop and interpolation) as a (C, H, W) uint8 tensor;
    array images, a (C, H, W) or (B, C, H, W) tensor, unchanged at that size, else resized as
    float by `resize_batch` (bilinear, antialiased when shrinking)."""
    if isinstance(image, Image.Image):
        return preprocess.to_uint8(image)
    if tuple(image.shape[-2:]) == tuple(preprocess.img_size):
        return image
    batch = image.float() if image.dim() == 4 else image.float()[None]
    resized = resize_batch(batch, preprocess.img_size)
    return resized if image.dim() == 4 else resized[0]


def stack_images(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """One (B, C, H, W) batch: uint8 when every image is, else float32 (uint8 values kept)."""
    if all(image.dtype == torch.uint8 for image in images):
        return torch.stack(list(images))
    return torch.stack([image.float() for image in images])
