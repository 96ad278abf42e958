"""Batched data augmentation on uint8 image tensors (B, C, H, W), C = 1 or 3 (flips and
Mixup/CutMix also take float arrays of any channel count, `data=arrays`).

Every function works on the whole batch with tensor ops (the only Python loops run over a
handful of op groups, never over samples or pixels) and draws all its randomness from the
`torch.Generator` passed as `generator`, so the same generator state gives the same output.

Contents: `random_crop`, `random_flip`, `trivial_augment` (with `apply_op` and `op_magnitude`
to run one named op), `random_erasing`, `mixup_cutmix`, `one_hot_smooth` and
`soft_cross_entropy` (the classification task's, from `vitkit.tasks`), `normalize`
(`vitkit.preprocess.normalize`), `resize_batch` (`vitkit.data.transforms`'s), and
`BatchAugment`, which chains them from an `AugmentConfig`.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from vitkit.data.transforms import resize_batch  # its owner; kept importable from here
from vitkit.errors import InputError
from vitkit.preprocess import normalize
from vitkit.tasks import Task, make_task, one_hot_smooth, soft_cross_entropy

__all__ = [
    "OPS",
    "PICTURE_ONLY",
    "AugmentConfig",
    "BatchAugment",
    "MixInfo",
    "apply_op",
    "mixup_cutmix",
    "mixup_cutmix_info",
    "normalize",
    "one_hot_smooth",
    "op_magnitude",
    "random_crop",
    "random_erasing",
    "random_flip",
    "random_flip_arrays",
    "resize_batch",
    "soft_cross_entropy",
    "trivial_augment",
]

#: The TrivialAugment-Wide op set, in the order `trivial_augment` indexes it.
OPS: tuple[str, ...] = (
    "identity",
    "brightness",
    "contrast",
    "color",
    "sharpness",
    "posterize",
    "solarize",
    "autocontrast",
    "equalize",
    "rotate",
    "shear_x",
    "shear_y",
    "translate_x",
    "translate_y",
)

# Ops whose magnitude gets a random sign.
_SIGNED = frozenset(
    {"brightness", "contrast", "color", "sharpness", "rotate", "shear_x", "shear_y",
     "translate_x", "translate_y"}
)
# Largest magnitude of each signed op (TrivialAugmentWide's ranges). The translate entry is a
# fraction of the image side: torchvision uses 32 px absolute, the whole width of a 32 px image;
# we scale it to the image and cap it at half the side.
_MAX = {
    "brightness": 0.99,
    "contrast": 0.99,
    "color": 0.99,
    "sharpness": 0.99,
    "rotate": 135.0,
    "shear_x": 0.99,
    "shear_y": 0.99,
    "translate_x": 0.5,
    "translate_y": 0.5,
}
_GRAY = (0.2989, 0.587, 0.114)


def _check_images(images: torch.Tensor, name: str = "images") -> None:
    if images.dtype != torch.uint8 or images.dim() != 4 or images.shape[1] not in (1, 3):
        raise InputError(f"{name} must be uint8 (B, C, H, W) with C = 1 or 3, got "
                         f"{images.dtype} {tuple(images.shape)}")


def _check_any_images(images: torch.Tensor) -> None:
    """uint8 pictures (C = 1 or 3), or float arrays (B, C, H, W) of any channel count."""
    if images.is_floating_point() and images.dim() == 4:
        return
    _check_images(images)


def _to_uint8(x: torch.Tensor) -> torch.Tensor:
    return x.round().clamp_(0, 255).to(torch.uint8)


def _per_sample(value: float | torch.Tensor, n: int) -> torch.Tensor:
    """`value` as a float tensor (n,): a scalar is repeated, a tensor must hold n values."""
    t = torch.as_tensor(value, dtype=torch.float32).flatten()
    if t.numel() == 1:
        return t.expand(n)
    if t.numel() != n:
        raise InputError(f"magnitude has {t.numel()} values for a batch of {n}")
    return t


# ---------------------------------------------------------------------------------------------
# Crop and flip


def random_crop(images: torch.Tensor, padding: int, generator: torch.Generator,
                mode: str = "constant") -> torch.Tensor:
    """Pad each side by `padding` (zeros, or `mode="reflect"`), then crop a random H x W window
    per sample. The padding is never materialised: each sample's row and column indices are
    mapped back into the image and the window is read with one `gather`."""
    _check_images(images)
    if padding < 0:
        raise InputError(f"padding must be >= 0, got {padding}")
    if mode not in ("constant", "reflect"):
        raise InputError(f"mode must be 'constant' or 'reflect', got {mode!r}")
    b, c, h, w = images.shape
    if padding == 0:
        return images.clone()
    if mode == "reflect" and padding >= min(h, w):
        raise InputError(f"reflect padding {padding} needs images larger than {padding} px")
    oy = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
    ox = torch.randint(0, 2 * padding + 1, (b,), generator=generator)
    rows = oy[:, None] + torch.arange(h) - padding  # (B, H) in image coordinates
    cols = ox[:, None] + torch.arange(w) - padding  # (B, W)
    if mode == "reflect":
        rows = torch.where(rows < 0, -rows, rows)
        rows = torch.where(rows >= h, 2 * (h - 1) - rows, rows)
        cols = torch.where(cols < 0, -cols, cols)
        cols = torch.where(cols >= w, 2 * (w - 1) - cols, cols)
        valid = None
    else:
        valid = ((rows >= 0) & (rows < h))[:, :, None] & ((cols >= 0) & (cols < w))[:, None, :]
        rows, cols = rows.clamp(0, h - 1), cols.clamp(0, w - 1)
    index = (rows[:, :, None] * w + cols[:, None, :]).view(b, 1, h * w).expand(b, c, h * w)
    out = images.reshape(b, c, h * w).gather(2, index).view(b, c, h, w)
    if valid is not None:
        out = out * valid[:, None].to(torch.uint8)
    return out


def random_flip(images: torch.Tensor, generator: torch.Generator, p: float = 0.5
                ) -> torch.Tensor:
    """Flip each sample of a uint8 batch horizontally with probability `p`."""
    _check_images(images)
    return _flip(images, generator, p)


def random_flip_arrays(images: torch.Tensor, generator: torch.Generator, p: float = 0.5
                       ) -> torch.Tensor:
    """`random_flip` of float arrays (B, C, H, W), any channel count: the same draws."""
    if not images.is_floating_point() or images.dim() != 4:
        raise InputError(f"images must be float (B, C, H, W), got {images.dtype} "
                         f"{tuple(images.shape)}")
    return _flip(images, generator, p)


def _flip(images: torch.Tensor, generator: torch.Generator, p: float) -> torch.Tensor:
    flip = torch.rand(images.shape[0], generator=generator) < p
    return torch.where(flip[:, None, None, None], images.flip(-1), images)


# ---------------------------------------------------------------------------------------------
# TrivialAugment ops


def _gray(x: torch.Tensor) -> torch.Tensor:
    """Luma of float images (n, C, H, W) as (n, 1, H, W); a 1-channel image is its own luma."""
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(1)
    return (_GRAY[0] * r + _GRAY[1] * g + _GRAY[2] * b).unsqueeze(1)


def _blend(x: torch.Tensor, base: torch.Tensor, factor: torch.Tensor) -> torch.Tensor:
    """`base + factor * (x - base)` with a per-sample factor, back to uint8."""
    return _to_uint8(base + factor.view(-1, 1, 1, 1) * (x - base))


def _sharpness_base(x: torch.Tensor) -> torch.Tensor:
    """The smoothed image sharpness blends away from: 3x3 kernel (1 1 1 / 1 5 1 / 1 1 1)/13
    on the interior, the border pixels left as they are."""
    n, c, h, w = x.shape
    kernel = torch.ones(1, 1, 3, 3, dtype=x.dtype)
    kernel[0, 0, 1, 1] = 5.0
    kernel /= kernel.sum()
    smooth = F.conv2d(x.reshape(n * c, 1, h, w), kernel).reshape(n, c, h - 2, w - 2)
    base = x.clone()
    base[:, :, 1:-1, 1:-1] = smooth.round()
    return base


def _equalize(images: torch.Tensor) -> torch.Tensor:
    """Histogram equalisation per sample and channel: one `bincount` over offset values, a
    cumulative sum, and a lookup table mapping the lowest value present to 0 and the highest to
    255. Constant channels are left unchanged."""
    n, c, h, w = images.shape
    flat = images.reshape(n * c, h * w).long()
    offsets = torch.arange(n * c)[:, None] * 256
    hist = torch.bincount((flat + offsets).flatten(), minlength=n * c * 256).view(n * c, 256)
    cdf = hist.cumsum(-1)
    total = h * w
    cdf_min = torch.where(hist > 0, cdf, total).amin(-1, keepdim=True)
    denom = total - cdf_min
    lut = ((cdf - cdf_min).clamp_(min=0) * 255.0 / denom.clamp(min=1)).round_().clamp_(0, 255)
    lut = torch.where(denom > 0, lut, torch.arange(256, dtype=lut.dtype))
    return lut.to(torch.uint8).gather(1, flat).view(n, c, h, w)


def _autocontrast(x: torch.Tensor) -> torch.Tensor:
    """Stretch each channel of each sample so its min maps to 0 and its max to 255."""
    lo = x.amin(dim=(2, 3), keepdim=True)
    hi = x.amax(dim=(2, 3), keepdim=True)
    flat = hi <= lo
    scale = torch.where(flat, 1.0, 255.0 / (hi - lo).clamp(min=1e-6))
    lo = torch.where(flat, 0.0, lo)
    return _to_uint8((x - lo) * scale)


def _affine(images: torch.Tensor, matrix: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """Apply the forward maps `out = matrix @ in + shift` (pixel units, origin at the image
    centre, y down), one per sample, by nearest sampling with zero fill."""
    n, c, h, w = images.shape
    inv = torch.linalg.inv(matrix.double())
    s = torch.tensor([w / 2.0, h / 2.0], dtype=torch.float64)
    # affine_grid maps output to input in normalised coordinates: S^-1 M^-1 S, -S^-1 M^-1 t.
    lin = inv * s[None, None, :] / s[None, :, None]
    trans = -(inv @ shift.double()[:, :, None]).squeeze(-1) / s
    theta = torch.cat([lin, trans[:, :, None]], dim=2).float()
    grid = F.affine_grid(theta, [n, c, h, w], align_corners=False)
    out = F.grid_sample(images.float(), grid, mode="nearest", padding_mode="zeros",
                        align_corners=False)
    return _to_uint8(out)


def apply_op(images: torch.Tensor, name: str, magnitude: float | torch.Tensor | None = None
             ) -> torch.Tensor:
    """Apply one TrivialAugment op to every sample of a uint8 batch.

    `magnitude` is the op's own parameter, a scalar or one value per sample:
    brightness / contrast / color / sharpness: blend factor (1 = unchanged);
    posterize: bits kept (8 = unchanged); solarize: threshold (pixels >= it are inverted);
    rotate: degrees, counter-clockwise; shear_x / shear_y: shear coefficient, about the centre;
    translate_x / translate_y: pixels (right / down). identity, autocontrast and equalize take
    none. Colour (saturation) is the identity on 1-channel images.
    """
    _check_images(images)
    if name not in OPS:
        raise InputError(f"unknown op {name!r}; choose from {', '.join(OPS)}")
    n = images.shape[0]
    if name == "identity" or n == 0:
        return images.clone()
    if name == "equalize":
        return _equalize(images)
    if name == "autocontrast":
        return _autocontrast(images.float())
    if magnitude is None:
        raise InputError(f"op {name!r} needs a magnitude")
    m = _per_sample(magnitude, n)
    if name == "posterize":
        bits = m.round().long().clamp(0, 8)
        mask = ((255 << (8 - bits)) & 255).to(torch.uint8)
        return images & mask.view(-1, 1, 1, 1)
    if name == "solarize":
        return torch.where(images.float() >= m.view(-1, 1, 1, 1), 255 - images, images)
    if name in ("rotate", "shear_x", "shear_y", "translate_x", "translate_y"):
        matrix = torch.eye(2).repeat(n, 1, 1)
        shift = torch.zeros(n, 2)
        if name == "rotate":
            rad = torch.deg2rad(m)
            cos, sin = torch.cos(rad), torch.sin(rad)
            matrix = torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], 1)
        elif name == "shear_x":
            matrix[:, 0, 1] = m
        elif name == "shear_y":
            matrix[:, 1, 0] = m
        elif name == "translate_x":
            shift[:, 0] = m
        else:
            shift[:, 1] = m
        return _affine(images, matrix, shift)
    x = images.float()
    if name == "brightness":
        return _blend(x, torch.zeros_like(x), m)
    if name == "contrast":
        return _blend(x, _gray(x).mean(dim=(1, 2, 3), keepdim=True), m)
    if name == "color":
        if images.shape[1] == 1:
            return images.clone()
        return _blend(x, _gray(x), m)
    # sharpness
    if min(images.shape[2:]) < 3:
        return images.clone()
    return _blend(x, _sharpness_base(x), m)


def op_magnitude(name: str, bins: torch.Tensor, num_bins: int, sign: torch.Tensor,
                 size: tuple[int, int]) -> torch.Tensor:
    """The `apply_op` parameter for magnitude bin indices `bins` (0 .. num_bins - 1, 0 the
    weakest), signs `sign` (+-1, used by signed ops) and image `size` (H, W).

    Ranges follow TrivialAugmentWide: factors 1 +- 0.99, rotate +-135 degrees, shear +-0.99,
    posterize 8 .. 2 bits, solarize threshold 255 .. 0; translate +- half the image side.
    """
    frac = bins.float() / (num_bins - 1) if num_bins > 1 else torch.zeros(bins.shape)
    if name == "posterize":
        return 8.0 - (6.0 * frac).round()
    if name == "solarize":
        return 255.0 * (1.0 - frac)
    if name not in _SIGNED:
        return torch.zeros(bins.shape)
    value = _MAX[name] * frac * sign.float()
    if name in ("brightness", "contrast", "color", "sharpness"):
        return 1.0 + value
    if name == "translate_x":
        return value * size[1]
    if name == "translate_y":
        return value * size[0]
    return value


def trivial_augment(images: torch.Tensor, generator: torch.Generator, magnitude_bins: int = 31,
                    ops: Sequence[str] | None = None) -> torch.Tensor:
    """TrivialAugment-Wide: each sample gets one op drawn uniformly from `ops` (default `OPS`)
    with a uniformly drawn magnitude bin and sign; samples are grouped by op and each group is
    transformed in one batched call to `apply_op`.

    Draws, in order: op index (B,), magnitude bin (B,), sign (B,).
    """
    _check_images(images)
    names = tuple(OPS if ops is None else ops)
    if not names:
        raise InputError("ops must name at least one op")
    for name in names:
        if name not in OPS:
            raise InputError(f"unknown op {name!r}; choose from {', '.join(OPS)}")
    if magnitude_bins < 1:
        raise InputError(f"magnitude_bins must be >= 1, got {magnitude_bins}")
    b, _, h, w = images.shape
    choice = torch.randint(len(names), (b,), generator=generator)
    bins = torch.randint(magnitude_bins, (b,), generator=generator)
    sign = torch.randint(2, (b,), generator=generator) * 2 - 1
    out = images.clone()
    for k, name in enumerate(names):
        if name == "identity":
            continue
        idx = (choice == k).nonzero().flatten()
        if idx.numel() == 0:
            continue
        param = op_magnitude(name, bins[idx], magnitude_bins, sign[idx], (h, w))
        out[idx] = apply_op(images[idx], name, param)
    return out


# ---------------------------------------------------------------------------------------------
# Random erasing


def random_erasing(images: torch.Tensor, generator: torch.Generator, p: float = 0.25,
                   scale: tuple[float, float] = (0.02, 0.33),
                   ratio: tuple[float, float] = (0.3, 3.3)) -> torch.Tensor:
    """With probability `p` per sample, fill one random rectangle with uniform uint8 noise.

    The rectangle's area is a `scale` fraction of the image and its aspect (h / w) is
    log-uniform in `ratio`; ten candidates are drawn per sample and the first that fits is used
    (else the last, clipped to the image). The selected samples are erased at once through a
    mask built from their bounds by broadcast comparisons.
    """
    _check_images(images)
    b, _, h, w = images.shape
    tries = 10
    selected = torch.rand(b, generator=generator) < p
    area = h * w * (scale[0] + (scale[1] - scale[0]) * torch.rand(b, tries, generator=generator))
    log_lo, log_hi = math.log(ratio[0]), math.log(ratio[1])
    aspect = torch.exp(log_lo + (log_hi - log_lo) * torch.rand(b, tries, generator=generator))
    eh = torch.sqrt(area * aspect).round().long()
    ew = torch.sqrt(area / aspect).round().long()
    fits = (eh >= 1) & (eh < h) & (ew >= 1) & (ew < w)
    # First fitting candidate, or the last one when none fits.
    pick = torch.where(fits.any(1), fits.int().argmax(1), tries - 1)
    eh = eh.gather(1, pick[:, None]).squeeze(1).clamp(1, h)
    ew = ew.gather(1, pick[:, None]).squeeze(1).clamp(1, w)
    top = (torch.rand(b, generator=generator) * (h - eh + 1)).long().clamp(max=h - eh)
    left = (torch.rand(b, generator=generator) * (w - ew + 1)).long().clamp(max=w - ew)
    idx = selected.nonzero().flatten()
    noise = torch.randint(0, 256, (idx.numel(), *images.shape[1:]), generator=generator,
                          dtype=torch.uint8)
    top, left, eh, ew = top[idx], left[idx], eh[idx], ew[idx]
    rows, cols = torch.arange(h), torch.arange(w)
    in_rows = (rows >= top[:, None]) & (rows < (top + eh)[:, None])  # (n, H)
    in_cols = (cols >= left[:, None]) & (cols < (left + ew)[:, None])  # (n, W)
    mask = in_rows[:, :, None] & in_cols[:, None, :]
    out = images.clone()
    out[idx] = torch.where(mask[:, None], noise, images[idx])
    return out


# ---------------------------------------------------------------------------------------------
# Mixup / CutMix, targets and loss


@dataclass(frozen=True)
class MixInfo:
    """What `mixup_cutmix_info` did: `mode` is "none", "mixup" or "cutmix"; `lam` the weight of
    the original batch (for cutmix, 1 - the pasted area fraction); `box` the pasted
    (top, left, bottom, right) for cutmix, bottom/right exclusive."""

    mode: str
    lam: float
    box: tuple[int, int, int, int] | None = None


def mixup_cutmix_info(images: torch.Tensor, targets: torch.Tensor, generator: torch.Generator,
                      mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0,
                      switch_prob: float = 0.5) -> tuple[torch.Tensor, torch.Tensor, MixInfo]:
    """`mixup_cutmix` that also returns what it did (`MixInfo`)."""
    if not images.is_floating_point() or images.dim() != 4:
        raise InputError(f"images must be float (B, C, H, W), got {images.dtype} "
                         f"{tuple(images.shape)}")
    if targets.dim() != 2 or targets.shape[0] != images.shape[0]:
        raise InputError(f"targets must be (B, num_classes) for a batch of {images.shape[0]}, "
                         f"got {tuple(targets.shape)}")
    if mixup_alpha < 0 or cutmix_alpha < 0:
        raise InputError("mixup_alpha and cutmix_alpha must be >= 0")
    if mixup_alpha == 0 and cutmix_alpha == 0:
        return images, targets, MixInfo("none", 1.0)
    # torch has no generator-aware Beta sampler: seed numpy from the generator instead.
    seed = int(torch.randint(2**31, (1,), generator=generator))
    rng = np.random.default_rng(seed)
    if mixup_alpha > 0 and cutmix_alpha > 0:
        use_cutmix = bool(rng.random() < switch_prob)
    else:
        use_cutmix = cutmix_alpha > 0
    alpha = cutmix_alpha if use_cutmix else mixup_alpha
    lam = float(rng.beta(alpha, alpha))
    partner = images.flip(0)
    if use_cutmix:
        h, w = images.shape[2:]
        side = math.sqrt(1.0 - lam)
        ch, cw = int(h * side), int(w * side)
        cy, cx = int(rng.integers(h)), int(rng.integers(w))
        top, bottom = max(cy - ch // 2, 0), min(cy + ch // 2, h)
        left, right = max(cx - cw // 2, 0), min(cx + cw // 2, w)
        lam = 1.0 - (bottom - top) * (right - left) / (h * w)
        mixed = images.clone()
        mixed[:, :, top:bottom, left:right] = partner[:, :, top:bottom, left:right]
        info = MixInfo("cutmix", lam, (top, left, bottom, right))
    else:
        mixed = lam * images + (1.0 - lam) * partner
        info = MixInfo("mixup", lam)
    mixed_targets = lam * targets + (1.0 - lam) * targets.flip(0)
    return mixed, mixed_targets, info


def mixup_cutmix(images: torch.Tensor, targets: torch.Tensor, generator: torch.Generator,
                 mixup_alpha: float = 0.8, cutmix_alpha: float = 1.0, switch_prob: float = 0.5
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """Mix a float batch with its reverse (`images.flip(0)`): per batch, CutMix with probability
    `switch_prob` (when both are enabled), else Mixup; lambda ~ Beta(alpha, alpha). CutMix
    corrects lambda to the pasted box's real area. Targets (one-hot or soft) are mixed with the
    same lambda. An alpha of 0 disables that mode; both 0 return the inputs unchanged."""
    mixed, mixed_targets, _ = mixup_cutmix_info(images, targets, generator, mixup_alpha,
                                                cutmix_alpha, switch_prob)
    return mixed, mixed_targets


# ---------------------------------------------------------------------------------------------
# The whole pipeline


@dataclass
class AugmentConfig:
    """Which augmentations `BatchAugment` applies. `random_erasing` is the per-sample
    probability (0 = off); an alpha of 0 turns Mixup / CutMix off."""

    crop_padding: int = 4
    flip: bool = True
    trivial_augment: bool = False
    random_erasing: float = 0.0
    mixup_alpha: float = 0.0
    cutmix_alpha: float = 0.0
    label_smoothing: float = 0.0


# What float arrays (data=arrays) take: no crop padding, colour op or erasing of pixels that
# are measurements, not a picture; flips only when asked (`float_augment_config`).
PICTURE_ONLY = ("crop_padding", "trivial_augment", "random_erasing")


class BatchAugment:
    """Training-time augmentation of a batch into float images and float targets.

    Order: random crop, flip, TrivialAugment, random erasing, normalise, the task's targets
    (classification: one-hot with label smoothing), Mixup / CutMix (which mixes any task's
    targets). Erasing runs on uint8 before normalising, so erased pixels are uniform noise
    over 0..255 in image space. Float arrays take flips and Mixup / CutMix only.
    """

    def __init__(self, config: AugmentConfig, num_classes: int, task: Task | None = None
                 ) -> None:
        self.config = config
        self.num_classes = num_classes
        self.task = task or make_task("classification")

    def __call__(self, images: torch.Tensor, labels: torch.Tensor, generator: torch.Generator,
                 mean: Sequence[float] | torch.Tensor, std: Sequence[float] | torch.Tensor,
                 scale: float = 255.0) -> tuple[torch.Tensor, torch.Tensor]:
        cfg = self.config
        _check_any_images(images)
        if images.is_floating_point():
            asked = [name for name in PICTURE_ONLY if getattr(cfg, name)]
            if asked:
                raise InputError(f"{', '.join(asked)} augment uint8 pictures, not float "
                                 "arrays: turn them off for this data")
        if cfg.crop_padding > 0:
            images = random_crop(images, cfg.crop_padding, generator)
        if cfg.flip:
            flip = random_flip_arrays if images.is_floating_point() else random_flip
            images = flip(images, generator)
        if cfg.trivial_augment:
            images = trivial_augment(images, generator)
        if cfg.random_erasing > 0:
            images = random_erasing(images, generator, p=cfg.random_erasing)
        x = normalize(images, mean, std, scale)
        targets = self.task.training_targets(labels, self.num_classes, cfg.label_smoothing)
        if cfg.mixup_alpha > 0 or cfg.cutmix_alpha > 0:
            x, targets = mixup_cutmix(x, targets, generator, cfg.mixup_alpha, cfg.cutmix_alpha)
        return x, targets
