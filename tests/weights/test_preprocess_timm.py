"""The shorter-side resize and centre crop (`resize_mode="shorter_side"`, crop_pct) equal
timm's evaluation transform, pixel for pixel: timm weights loaded with their pretrained_cfg
see what timm gives them: each side scaled as timm floors it (the longer side truncated) and
the crop offset rounded as torchvision rounds it (rounding size / crop_pct per side and flooring
the offset put a 40x50 image at 32 px and crop_pct 0.9 up to 1.58 off after normalisation, and
changed a timm model's top-1). Reference: timm's `create_transform` (its own code, on PIL images).
Tolerance: 1e-6 (the same uint8 pixels, normalised in float32 by both)."""

import numpy as np
import pytest
from PIL import Image
from timm.data import create_transform

from vitkit.preprocess import Preprocess

SHAPES = [(40, 50), (50, 40), (37, 91), (300, 301), (33, 33), (97, 64), (31, 200)]


@pytest.mark.parametrize("size", [32, 224, (32, 48), (40, 24)])
@pytest.mark.parametrize("crop_pct", [0.875, 0.9, 0.95, 1.0])
def test_shorter_side_and_centre_crop_equal_timms_eval_transform(size, crop_pct):
    assert_equal_to_timm(size, crop_pct, "center", "shorter_side", seed=0)


def assert_equal_to_timm(size: int | tuple[int, int], crop_pct: float, crop_mode: str,
                         resize_mode: str, seed: int) -> None:
    """vitkit's `resize_mode` and timm's `crop_mode` give the same pixels on every SHAPE."""
    rng = np.random.default_rng(seed)
    hw = size if isinstance(size, tuple) else (size, size)
    reference = create_transform(input_size=(3, *hw), interpolation="bicubic", crop_pct=crop_pct,
                                 crop_mode=crop_mode, mean=(0.5,) * 3, std=(0.5,) * 3)
    ours = Preprocess(img_size=size, resize_mode=resize_mode, crop_pct=crop_pct,
                      interpolation="bicubic")
    for shape in SHAPES:
        image = Image.fromarray((rng.random((*shape, 3)) * 255).astype(np.uint8))
        assert (ours([image])[0] - reference(image)).abs().max().item() <= 1e-6, shape


@pytest.mark.parametrize("size", [32, (32, 48)])
@pytest.mark.parametrize("crop_pct", [0.875, 0.9, 1.0])
def test_squash_with_a_crop_equals_timms_squash_crop_mode(size, crop_pct):
    """timm's crop_mode "squash": each side to floor(size / crop_pct), then the centre crop
    (the whole frame at crop_pct 1). vitkit's "squash" ignored crop_pct."""
    assert_equal_to_timm(size, crop_pct, "squash", "squash", seed=1)


def test_a_timm_folder_with_crop_mode_squash_is_read_as_squash(tmp_path):
    """timm's own folders may say crop_mode "squash" (vit_so400m_patch14_siglip_gap_378's
    webli_ft_in1k); vitkit read every timm folder as "center" and cropped the centre where
    timm squashes the whole frame (up to 0.235 apart on a smooth 120x160 image)."""
    import timm
    from timm.data import resolve_data_config
    from timm.models import save_for_hf

    import vitkit

    reference = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=48,
                                  num_classes=3)
    reference.pretrained_cfg = {**reference.pretrained_cfg, "input_size": (3, 48, 48),
                                "crop_mode": "squash", "crop_pct": 0.9}
    save_for_hf(reference, tmp_path)
    model = vitkit.load_pretrained(tmp_path)
    assert (model.preprocess.resize_mode, model.preprocess.crop_pct) == ("squash", 0.9)
    yy, xx = np.mgrid[0:120, 0:160]
    image = Image.fromarray(np.stack([xx * 255 // 160, yy * 255 // 120, (xx + yy) * 255 // 280],
                                     -1).astype(np.uint8))
    theirs = create_transform(**resolve_data_config(model=reference))(image)
    assert (model.preprocess([image])[0] - theirs).abs().max().item() <= 1e-6
    assert resolve_data_config(model=model) == resolve_data_config(model=reference)
