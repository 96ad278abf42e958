"""The shorter-side resize and centre crop (`resize_mode="shorter_side"`, crop_pct) equal
timm's evaluation transform, pixel for pixel: timm weights loaded with their pretrained_cfg
see what timm gives them. Before, each side was rounded from size / crop_pct (timm: floor, the
longer side truncated) and the crop offset floored (torchvision: rounded), so a 40x50 image
at 32 px and crop_pct 0.9 came out up to 1.58 apart after normalisation, and the top-1 class
of a timm model changed. Reference: timm's `create_transform` (its own code, on PIL images).
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
    rng = np.random.default_rng(0)
    hw = size if isinstance(size, tuple) else (size, size)
    reference = create_transform(input_size=(3, *hw), interpolation="bicubic", crop_pct=crop_pct,
                                 crop_mode="center", mean=(0.5,) * 3, std=(0.5,) * 3)
    ours = Preprocess(img_size=size, resize_mode="shorter_side", crop_pct=crop_pct,
                      interpolation="bicubic")
    for shape in SHAPES:
        image = Image.fromarray((rng.random((*shape, 3)) * 255).astype(np.uint8))
        assert (ours([image])[0] - reference(image)).abs().max().item() <= 1e-6, shape
