"""The preprocessing a set of weights expects, stored beside them and applied to PIL images.

The official Google checkpoints resize the whole image to the model's size (no crop, bilinear)
and scale pixels to [-1, 1] (mean = std = 0.5); ImageNet-style weights usually resize the
shorter side, centre-crop and use the ImageNet mean/std. Getting this wrong costs points.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from PIL import Image

from vitkit.errors import ConfigError, InputError
from vitkit.fieldtypes import check_known_keys

RESIZE_MODES = ("squash", "shorter_side")
CROP_OFFSETS = ("round", "floor")
INTERPOLATIONS = {"bilinear": Image.Resampling.BILINEAR, "bicubic": Image.Resampling.BICUBIC,
                  "nearest": Image.Resampling.NEAREST, "lanczos": Image.Resampling.LANCZOS}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
# Test-time augmentation: the views of each input a model's outputs are averaged over
# (flip: the input and its mirror image; `vitkit.inference.tta` applies them).
TTA_MODES = ("none", "flip")


def check_tta(tta: str) -> str:
    """`tta` if it is one of `TTA_MODES`, else a ConfigError naming them."""
    if tta not in TTA_MODES:
        raise ConfigError(f"tta={tta!r} is not one of {', '.join(TTA_MODES)} (flip: average "
                          "the outputs on each image and its mirror image)")
    return tta


@dataclass
class Preprocess:
    """How raw images become model input.

    `resize_mode="squash"` resizes to `img_size` directly (the official ViT evaluation), or
    with `crop_pct` < 1 each side to size / crop_pct and then centre-crops `img_size` (timm's
    crop mode "squash"; Hugging Face's resize-then-crop processors, such as DeiT's 256 -> 224);
    "shorter_side" scales the shorter side to size / crop_pct and centre-crops `img_size`,
    in timm's arithmetic (`transforms_imagenet_eval`, crop mode "center"), so timm weights
    see the pixels timm gives them.
    """

    img_size: tuple[int, int] = (224, 224)
    resize_mode: str = "squash"
    crop_pct: float = 1.0
    interpolation: str = "bilinear"
    mean: tuple[float, ...] = (0.5, 0.5, 0.5)
    std: tuple[float, ...] = (0.5, 0.5, 0.5)
    # the input value that becomes 1.0 before mean/std: 255 for 8-bit pictures; 1 for
    # scientific arrays, whose mean/std are in the data's own units (data=arrays)
    scale: float = 255.0
    # the centre crop's offset, half the pixels cut: "round" (half to even), as torchvision's
    # CenterCrop and so timm; "floor", as Hugging Face's processors (`center_crop`)
    crop_offset: str = "round"

    def __post_init__(self) -> None:
        size = self.img_size
        self.img_size = (size, size) if isinstance(size, int) else tuple(int(s) for s in size)
        self.mean = tuple(float(m) for m in self.mean)
        self.std = tuple(float(s) for s in self.std)
        self.scale = float(self.scale)
        if not self.scale > 0:
            raise ConfigError(f"scale must be positive, got {self.scale}")
        if self.resize_mode not in RESIZE_MODES:
            raise ConfigError(f"resize_mode={self.resize_mode!r} is not one of "
                              f"{', '.join(RESIZE_MODES)}")
        if self.interpolation not in INTERPOLATIONS:
            raise ConfigError(f"interpolation={self.interpolation!r} is not one of "
                              f"{', '.join(INTERPOLATIONS)}")
        if self.crop_offset not in CROP_OFFSETS:
            raise ConfigError(f"crop_offset={self.crop_offset!r} is not one of "
                              f"{', '.join(CROP_OFFSETS)}")
        if not 0.0 < self.crop_pct <= 1.0:
            raise ConfigError(f"crop_pct must be in (0, 1], got {self.crop_pct}")
        if len(self.mean) != len(self.std) or min(self.std) <= 0:
            raise ConfigError("mean and std need one positive std per channel")

    @property
    def channels(self) -> int:
        return len(self.mean)

    @property
    def pictures(self) -> bool:
        """Whether the inputs are 8-bit pictures (grey or RGB over 0..255), not arrays in the
        data's own units (data=arrays: `scale` 1)."""
        return self.scale == 255.0 and self.channels in (1, 3)

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data.update(img_size=list(self.img_size), mean=list(self.mean), std=list(self.std))
        if self.crop_offset == "round":  # the default: left out, for readers without the field
            del data["crop_offset"]
        return data

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Preprocess:
        check_known_keys(cls, data, "preprocess")
        return cls(**data)

    def replace(self, **changes: Any) -> Preprocess:
        return Preprocess.from_dict({**self.to_dict(), **changes})

    # -- application --------------------------------------------------------------------------
    def resize(self, image: Image.Image) -> Image.Image:
        """Resize (and crop) one PIL image to `img_size`, in the expected colour mode."""
        mode = "L" if self.channels == 1 else "RGB"
        image = image.convert(mode)
        height, width = self.img_size
        resample = INTERPOLATIONS[self.interpolation]
        if self.resize_mode == "squash" and self.crop_pct == 1.0:
            return image.resize((width, height), resample)
        if self.resize_mode == "squash":
            new_h, new_w = math.floor(height / self.crop_pct), math.floor(width / self.crop_pct)
        else:
            new_h, new_w = _shorter_side_size(image.height, image.width, height, width,
                                              self.crop_pct)
        new_h, new_w = max(height, new_h), max(width, new_w)
        image = image.resize((new_w, new_h), resample)
        left, top = self._crop_offset(new_w - width), self._crop_offset(new_h - height)
        return image.crop((left, top, left + width, top + height))

    def _crop_offset(self, cut: int) -> int:
        """Where the centre crop starts when `cut` pixels are cut from a side."""
        return cut // 2 if self.crop_offset == "floor" else round(cut / 2)

    def to_uint8(self, image: Image.Image) -> torch.Tensor:
        """(C, H, W) uint8 tensor of the resized image."""
        array = np.asarray(self.resize(image), dtype=np.uint8)
        if array.ndim == 2:
            array = array[:, :, None]
        return torch.from_numpy(array.copy()).permute(2, 0, 1)

    def normalize(self, batch: torch.Tensor) -> torch.Tensor:
        """(B, C, H, W) uint8 pictures or float arrays -> float32 (x / scale - mean) / std."""
        return normalize(batch, self.mean, self.std, self.scale)

    def __call__(self, images: list[Image.Image]) -> torch.Tensor:
        """A normalised float batch (B, C, H, W) from PIL images."""
        return self.normalize(torch.stack([self.to_uint8(image) for image in images]))


def crop_fraction(crop: int, resized: int) -> float:
    """The crop_pct whose floor(crop / crop_pct) is `resized` exactly (crop / resized, nudged
    down where float rounding would floor one pixel short): a processor that resizes to
    `resized` and centre-crops `crop`, in `Preprocess`'s terms."""
    fraction = crop / resized
    while math.floor(crop / fraction) < resized:
        fraction = math.nextafter(fraction, 0.0)
    return fraction


def _shorter_side_size(image_h: int, image_w: int, height: int, width: int,
                       crop_pct: float) -> tuple[int, int]:
    """The (H, W) an image is resized to before the centre crop, as timm's evaluation
    transform sizes it: each side's floor(size / crop_pct); for a square size the shorter
    side goes there and the longer one is truncated (torchvision's Resize(int)), for another
    the image's ratio is kept with both sides rounded (timm's ResizeKeepRatio)."""
    scaled_h, scaled_w = math.floor(height / crop_pct), math.floor(width / crop_pct)
    if height == width:
        if image_w <= image_h:
            return int(scaled_w * image_h / image_w), scaled_w
        return scaled_h, int(scaled_h * image_w / image_h)
    ratio = min(image_h / scaled_h, image_w / scaled_w)
    return round(image_h / ratio), round(image_w / ratio)


def normalize(images: torch.Tensor, mean: Sequence[float] | torch.Tensor,
              std: Sequence[float] | torch.Tensor, scale: float = 255.0) -> torch.Tensor:
    """(B, C, H, W) -> float32 `(x / scale - mean) / std` per channel, on the images' device:
    uint8 pictures with scale 255, or float arrays (data=arrays) with scale 1. The one
    normalisation of vitkit: training, evaluation, predict and explain."""
    if images.dim() != 4 or not (images.dtype == torch.uint8 or images.is_floating_point()):
        raise InputError(f"normalize takes uint8 or float images (B, C, H, W), got "
                         f"{images.dtype} {tuple(images.shape)}")
    m = torch.as_tensor(mean, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float32, device=images.device).view(1, -1, 1, 1)
    if m.shape[1] not in (1, images.shape[1]):
        raise InputError(f"the images have {images.shape[1]} channel(s) but mean/std have "
                         f"{m.shape[1]}: use a Preprocess with one mean and std per channel")
    return (images.float() / scale - m) / s


def official_preprocess(img_size: tuple[int, int], in_chans: int = 3) -> Preprocess:
    """What the official Google checkpoints expect: squash-resize, bilinear, [-1, 1]."""
    return Preprocess(img_size=img_size, mean=(0.5,) * in_chans, std=(0.5,) * in_chans)


def preprocess_for(model: Any) -> Preprocess:
    """The model's own preprocessing (`model.preprocess`, set by `load_pretrained`) at the
    model's current image size; the official one when the model carries none."""
    config = model.config
    pre = model.preprocess
    if pre is None:
        return official_preprocess(config.img_size, config.in_chans)
    if tuple(pre.img_size) != tuple(config.img_size):
        pre = pre.replace(img_size=list(config.img_size))
    return pre
