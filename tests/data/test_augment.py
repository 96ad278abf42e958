"""Batched augmentation: shapes, reproducibility and the exact effect of each op."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitkit.data.augment import (
    OPS,
    AugmentConfig,
    BatchAugment,
    apply_op,
    mixup_cutmix,
    mixup_cutmix_info,
    normalize,
    one_hot_smooth,
    op_magnitude,
    random_crop,
    random_erasing,
    random_flip,
    soft_cross_entropy,
    trivial_augment,
)
from vitkit.errors import InputError


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def noise(b: int = 8, c: int = 3, h: int = 12, w: int = 12, seed: int = 123) -> torch.Tensor:
    return torch.randint(0, 256, (b, c, h, w), generator=gen(seed), dtype=torch.uint8)


ALL_AUGMENTS = [
    lambda x, g: random_crop(x, 4, g),
    lambda x, g: random_crop(x, 3, g, mode="reflect"),
    lambda x, g: random_flip(x, g),
    lambda x, g: trivial_augment(x, g),
    lambda x, g: random_erasing(x, g, p=0.5),
]


# ------------------------------------------------------------------ shape, dtype, seeding


@pytest.mark.parametrize("channels", [1, 3])
@pytest.mark.parametrize("fn", ALL_AUGMENTS)
def test_shape_dtype_and_seeding(fn, channels: int) -> None:
    x = noise(16, channels, 12, 10)
    a, b, c = fn(x, gen(1)), fn(x, gen(1)), fn(x, gen(2))
    assert a.dtype == torch.uint8 and a.shape == x.shape
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_bad_input_rejected() -> None:
    with pytest.raises(InputError):
        random_flip(torch.zeros(2, 3, 4, 4), gen())
    with pytest.raises(InputError):
        trivial_augment(noise(), gen(), ops=["warp"])
    with pytest.raises(InputError):
        apply_op(noise(), "rotate")


# ------------------------------------------------------------------ crop and flip


def test_crop_padding_zero_is_identity() -> None:
    x = noise()
    assert torch.equal(random_crop(x, 0, gen()), x)


@pytest.mark.parametrize("mode", ["constant", "reflect"])
def test_crop_is_a_window_of_the_padded_image(mode: str) -> None:
    pad = 3
    x = noise(12, 3, 8, 7)
    out = random_crop(x, pad, gen(5), mode=mode)
    padded = F.pad(x.float(), (pad, pad, pad, pad), mode=mode).to(torch.uint8)
    offsets = set()
    for i in range(len(x)):
        found = [(dy, dx) for dy in range(2 * pad + 1) for dx in range(2 * pad + 1)
                 if torch.equal(out[i], padded[i, :, dy:dy + 8, dx:dx + 7])]
        assert len(found) == 1, f"sample {i}: {found}"
        offsets.add(found[0])
    assert len(offsets) > 1  # offsets are drawn per sample


def test_flip() -> None:
    x = noise()
    assert torch.equal(random_flip(x, gen(), p=1.0), x.flip(-1))
    assert torch.equal(random_flip(x, gen(), p=0.0), x)
    half = random_flip(noise(64), gen(), p=0.5)
    flipped = (half == noise(64).flip(-1)).flatten(1).all(1)
    assert 10 < int(flipped.sum()) < 54


# ------------------------------------------------------------------ single ops


@pytest.mark.parametrize("channels", [1, 3])
def test_identity_like_magnitudes(channels: int) -> None:
    x = noise(6, channels, 9, 9)
    for name, m in [("identity", None), ("brightness", 1.0), ("contrast", 1.0), ("color", 1.0),
                    ("sharpness", 1.0), ("posterize", 8), ("rotate", 0.0), ("shear_x", 0.0),
                    ("shear_y", 0.0), ("translate_x", 0.0), ("translate_y", 0.0)]:
        assert torch.equal(apply_op(x, name, m), x), name


def test_color_is_identity_on_gray() -> None:
    x = noise(4, 1)
    assert torch.equal(apply_op(x, "color", 0.1), x)
    gray = apply_op(noise(4, 3), "color", 0.0)  # factor 0 = fully desaturated
    assert torch.equal(gray[:, 0], gray[:, 1]) and torch.equal(gray[:, 1], gray[:, 2])


def test_brightness_and_contrast_values() -> None:
    x = noise()
    assert torch.equal(apply_op(x, "brightness", 0.0), torch.zeros_like(x))
    expected = (x.float() * 0.5).round().to(torch.uint8)
    assert torch.equal(apply_op(x, "brightness", 0.5), expected)
    flat = apply_op(x, "contrast", 0.0)  # every pixel becomes the sample's mean luma
    assert (flat.flatten(1).amax(1) == flat.flatten(1).amin(1)).all()


def test_sharpness_zero_blurs_interior_only() -> None:
    x = noise(2, 3, 6, 6)
    out = apply_op(x, "sharpness", 0.0)
    border = torch.ones(6, 6, dtype=torch.bool)
    border[1:-1, 1:-1] = False
    assert torch.equal(out[..., border], x[..., border])
    k = torch.tensor([[1.0, 1, 1], [1, 5, 1], [1, 1, 1]]) / 13
    ref = (x[0, 0, 0:3, 0:3].float() * k).sum().round()
    assert out[0, 0, 1, 1] == ref


def test_posterize_and_solarize() -> None:
    x = noise()
    assert torch.equal(apply_op(x, "posterize", 2), x & 0b11000000)
    assert torch.equal(apply_op(x, "solarize", 0), 255 - x)
    assert torch.equal(apply_op(x, "solarize", 256), x)
    out = apply_op(x, "solarize", 128)
    assert torch.equal(out, torch.where(x >= 128, 255 - x, x))
    # per-sample magnitudes
    per = apply_op(x[:2], "posterize", torch.tensor([8.0, 1.0]))
    assert torch.equal(per[0], x[0]) and torch.equal(per[1], x[1] & 0b10000000)


def test_autocontrast() -> None:
    x = (noise(4) // 4 + 60).to(torch.uint8)  # values in 60..123
    x[1, 2] = 77  # a constant channel stays as it is
    out = apply_op(x, "autocontrast")
    flat = out.flatten(2)
    keep = torch.ones(4, 3, dtype=torch.bool)
    keep[1, 2] = False
    assert (flat.amin(-1)[keep] == 0).all() and (flat.amax(-1)[keep] == 255).all()
    assert (out[1, 2] == 77).all()
    # order preserving per channel
    a, b = x[0, 0].flatten().long(), out[0, 0].flatten().long()
    assert ((a[:, None] < a[None, :]) <= (b[:, None] <= b[None, :])).all()


def _equalize_reference(channel: np.ndarray) -> np.ndarray:
    hist = np.bincount(channel.ravel(), minlength=256)
    cdf = hist.cumsum()
    cdf_min = cdf[hist > 0][0]
    if cdf[-1] == cdf_min:
        return channel
    lut = np.clip(np.round((cdf - cdf_min) * 255.0 / (cdf[-1] - cdf_min)), 0, 255)
    return lut.astype(np.uint8)[channel]


def test_equalize_matches_per_channel_reference() -> None:
    x = (noise(5, 3, 10, 10) // 8 + 100).to(torch.uint8)  # narrow range 100..131
    x[2, 1] = 9
    out = apply_op(x, "equalize")
    for i in range(5):
        for c in range(3):
            ref = _equalize_reference(x[i, c].numpy())
            assert np.array_equal(out[i, c].numpy(), ref), (i, c)
    flat = out.flatten(2)
    keep = torch.ones(5, 3, dtype=torch.bool)
    keep[2, 1] = False
    assert (flat.amin(-1)[keep] == 0).all() and (flat.amax(-1)[keep] == 255).all()


def test_rotate_translate_shear_geometry() -> None:
    x = noise(3, 3, 9, 9)
    assert torch.equal(apply_op(x, "rotate", 90.0), torch.rot90(x, 1, dims=(-2, -1)))
    assert torch.equal(apply_op(x, "rotate", -90.0), torch.rot90(x, -1, dims=(-2, -1)))
    out = apply_op(x, "translate_x", 3.0)
    assert torch.equal(out[..., 3:], x[..., :-3]) and (out[..., :3] == 0).all()
    out = apply_op(x, "translate_y", -2.0)
    assert torch.equal(out[..., :-2, :], x[..., 2:, :]) and (out[..., -2:, :] == 0).all()
    # shear_x by 1 about the centre shifts row y right by (y - 4) pixels
    out = apply_op(x, "shear_x", 1.0)
    for y in range(9):
        s = y - 4
        shifted = torch.zeros_like(x[..., y, :])
        if s >= 0:
            shifted[..., s:] = x[..., y, :9 - s]
        else:
            shifted[..., :s] = x[..., y, -s:]
        assert torch.equal(out[..., y, :], shifted), y
    xt = x.transpose(-1, -2)
    assert torch.equal(apply_op(xt, "shear_y", 1.0), out.transpose(-1, -2))


def test_op_magnitude_ranges() -> None:
    bins = torch.tensor([0, 30])
    plus, minus = torch.ones(2, dtype=torch.long), -torch.ones(2, dtype=torch.long)
    size = (32, 32)
    assert torch.allclose(op_magnitude("brightness", bins, 31, minus, size),
                          torch.tensor([1.0, 0.01]))
    assert torch.allclose(op_magnitude("rotate", bins, 31, plus, size),
                          torch.tensor([0.0, 135.0]))
    assert torch.allclose(op_magnitude("translate_x", bins, 31, plus, size),
                          torch.tensor([0.0, 16.0]))
    assert op_magnitude("posterize", bins, 31, plus, size).tolist() == [8.0, 2.0]
    assert op_magnitude("solarize", bins, 31, plus, size).tolist() == [255.0, 0.0]


# ------------------------------------------------------------------ trivial augment


def test_trivial_augment_identity_only_and_single_op() -> None:
    x = noise(16)
    assert torch.equal(trivial_augment(x, gen(), ops=["identity"]), x)
    assert torch.equal(trivial_augment(x, gen(), ops=["equalize"]), apply_op(x, "equalize"))
    # one bin = the weakest magnitude: solarize threshold 255 inverts only the 255s
    out = trivial_augment(x, gen(), ops=["solarize"], magnitude_bins=1)
    assert torch.equal(out, torch.where(x == 255, 0, x))


@pytest.mark.parametrize("channels", [1, 3])
def test_trivial_augment_matches_per_sample_ops(channels: int) -> None:
    x = noise(48, channels, 10, 10)
    bins = 31
    out = trivial_augment(x, gen(9), magnitude_bins=bins)
    g = gen(9)  # replay the draws: op index, magnitude bin, sign
    choice = torch.randint(len(OPS), (48,), generator=g)
    mag = torch.randint(bins, (48,), generator=g)
    sign = torch.randint(2, (48,), generator=g) * 2 - 1
    assert len(set(choice.tolist())) > 8
    for i in range(48):
        name = OPS[int(choice[i])]
        param = op_magnitude(name, mag[i:i + 1], bins, sign[i:i + 1], (10, 10))
        assert torch.equal(out[i:i + 1], apply_op(x[i:i + 1], name, param)), (i, name)
    changed = (out != x).flatten(1).any(1)
    assert int(changed.sum()) > 24


# ------------------------------------------------------------------ random erasing


def test_random_erasing_changes_one_rectangle() -> None:
    x = noise(32, 3, 16, 16)
    out = random_erasing(x, gen(3), p=1.0)
    changed = (out != x).any(1)  # (B, H, W)
    for i in range(32):
        ys, xs = torch.nonzero(changed[i], as_tuple=True)
        assert len(ys) > 0, i
        box = changed[i, int(ys.min()):int(ys.max()) + 1, int(xs.min()):int(xs.max()) + 1]
        # everything changed lies in the box, and nearly all of the box changed (noise can
        # repeat a pixel by chance, about 1 in 256**3 here)
        assert int(changed[i].sum()) == int(box.sum())
        assert box.float().mean() > 0.95
        area = box.numel() / 256
        assert 0.01 <= area <= 0.4


def test_random_erasing_p_zero() -> None:
    x = noise()
    assert torch.equal(random_erasing(x, gen(), p=0.0), x)


# ------------------------------------------------------------------ mixup / cutmix, targets


def test_mixup() -> None:
    x = torch.randn(6, 3, 8, 8, generator=gen(1))
    t = one_hot_smooth(torch.tensor([0, 1, 2, 3, 4, 0]), 5)
    mixed, targets, info = mixup_cutmix_info(x, t, gen(2), mixup_alpha=0.8, cutmix_alpha=0.0)
    assert info.mode == "mixup" and 0.0 <= info.lam <= 1.0
    assert torch.allclose(mixed, info.lam * x + (1 - info.lam) * x.flip(0))
    assert torch.allclose(targets, info.lam * t + (1 - info.lam) * t.flip(0))
    assert torch.allclose(targets.sum(-1), torch.ones(6))
    plain = mixup_cutmix(x, t, gen(2), mixup_alpha=0.8, cutmix_alpha=0.0)
    assert torch.equal(plain[0], mixed) and torch.equal(plain[1], targets)


def test_cutmix_area_matches_lambda() -> None:
    b = 6
    x = torch.arange(b, dtype=torch.float32).view(b, 1, 1, 1).expand(b, 3, 16, 16).clone()
    t = one_hot_smooth(torch.arange(b), b, smoothing=0.1)
    lams = []
    for seed in range(6):
        mixed, targets, info = mixup_cutmix_info(x, t, gen(seed), mixup_alpha=0.0,
                                                 cutmix_alpha=1.0)
        assert info.mode == "cutmix"
        pasted = (mixed == x.flip(0)).all(1).float().mean((1, 2))
        assert torch.allclose(pasted, torch.full((b,), 1 - info.lam))
        assert torch.allclose(targets, info.lam * t + (1 - info.lam) * t.flip(0))
        assert torch.allclose(targets.sum(-1), torch.ones(b))
        lams.append(info.lam)
    assert len(set(lams)) > 1


def test_mixup_cutmix_switch_and_disabled() -> None:
    x = torch.randn(4, 3, 8, 8)
    t = one_hot_smooth(torch.tensor([0, 1, 2, 3]), 4)
    modes = {mixup_cutmix_info(x, t, gen(s))[2].mode for s in range(20)}
    assert modes == {"mixup", "cutmix"}
    same_x, same_t = mixup_cutmix(x, t, gen(), mixup_alpha=0.0, cutmix_alpha=0.0)
    assert torch.equal(same_x, x) and torch.equal(same_t, t)
    a = mixup_cutmix(x, t, gen(7))
    b = mixup_cutmix(x, t, gen(7))
    assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])


def test_label_smoothing_values() -> None:
    t = one_hot_smooth(torch.tensor([2, 0]), 4, smoothing=0.2)
    expected = torch.tensor([[0.05, 0.05, 0.85, 0.05], [0.85, 0.05, 0.05, 0.05]])
    assert torch.allclose(t, expected)
    assert torch.equal(one_hot_smooth(torch.tensor([1]), 3), torch.tensor([[0.0, 1.0, 0.0]]))


def test_soft_cross_entropy() -> None:
    logits = torch.randn(7, 5)
    labels = torch.randint(0, 5, (7,))
    assert torch.allclose(soft_cross_entropy(logits, one_hot_smooth(labels, 5)),
                          F.cross_entropy(logits, labels))
    smooth = soft_cross_entropy(logits, one_hot_smooth(labels, 5, 0.1))
    assert torch.allclose(smooth, F.cross_entropy(logits, labels, label_smoothing=0.1))


def test_normalize() -> None:
    x = torch.tensor([0, 255, 51], dtype=torch.uint8).view(1, 3, 1, 1)
    out = normalize(x, (0.0, 0.5, 0.2), (1.0, 0.5, 0.1))
    assert out.dtype == torch.float32
    assert torch.allclose(out.flatten(), torch.tensor([0.0, 1.0, 0.0]), atol=1e-6)


def test_one_normalize_for_training_and_inference() -> None:
    """Training (augment), evaluation and predict (Preprocess) share one function."""
    from vitkit import preprocess

    assert normalize is preprocess.normalize
    x = noise(2, 3, 4, 4)
    pre = preprocess.Preprocess(img_size=4, mean=(0.1, 0.2, 0.3), std=(0.5, 0.6, 0.7))
    assert torch.equal(pre.normalize(x), normalize(x, pre.mean, pre.std))
    # float arrays (data=arrays) are normalised in their own units: scale 1, not 255
    arrays = pre.replace(scale=1)
    assert torch.allclose(arrays.normalize(x.float() / 255), pre.normalize(x), atol=1e-6)
    with pytest.raises(InputError, match="uint8 or float"):
        normalize(x.int(), pre.mean, pre.std)


# ------------------------------------------------------------------ pipeline


def test_batch_augment() -> None:
    cfg = AugmentConfig(trivial_augment=True, random_erasing=0.25, mixup_alpha=0.8,
                        cutmix_alpha=1.0, label_smoothing=0.1)
    aug = BatchAugment(cfg, num_classes=10)
    x = noise(16, 3, 16, 16)
    labels = torch.randint(0, 10, (16,), generator=gen())
    mean, std = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)
    a_x, a_t = aug(x, labels, gen(4), mean, std)
    b_x, b_t = aug(x, labels, gen(4), mean, std)
    assert a_x.shape == (16, 3, 16, 16) and a_x.dtype == torch.float32
    assert a_t.shape == (16, 10)
    assert torch.equal(a_x, b_x) and torch.equal(a_t, b_t)
    assert torch.allclose(a_t.sum(-1), torch.ones(16))
    assert not torch.equal(a_x, aug(x, labels, gen(5), mean, std)[0])
    # everything off: just normalise and one-hot
    plain = BatchAugment(AugmentConfig(crop_padding=0, flip=False), num_classes=10)
    p_x, p_t = plain(x, labels, gen(), mean, std)
    assert torch.equal(p_x, normalize(x, mean, std))
    assert torch.equal(p_t, one_hot_smooth(labels, 10))
