"""PNG bytes in memory for `/api/explain`: the image as the model sees it, and an attention map
over it (no files: Pillow writes to a buffer).

A picture is shown as it is (grey or RGB); a float array (data=arrays) as its channel mean,
scaled min to max, in viridis, as `vitkit explain`'s figures draw it. The map is upsampled
bilinearly, coloured with the jet colour map and blended at half opacity, as in `vitkit
explain`'s rollout overlays. Small inputs are enlarged (nearest) to at least `MIN_SIDE`
pixels so a 16x16 input is still visible.
"""

from __future__ import annotations

import base64
import io

import matplotlib
import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from vitkit.analysis.figures import FLOAT_IMAGE_CMAP, unit_scaled

__all__ = ["MIN_SIDE", "data_url", "image_png", "overlay_png"]

MIN_SIDE = 224  # pixels: the shorter side of the PNGs, at least
ALPHA = 0.5


def _display_size(height: int, width: int) -> tuple[int, int]:
    factor = max(1, -(-MIN_SIDE // min(height, width)))  # a whole factor: crisp pixels
    return height * factor, width * factor


def _rgb(image: torch.Tensor) -> np.ndarray:
    """(H, W, 3) uint8 of a (C, H, W) uint8 picture or float array."""
    array = image.detach().cpu()
    if array.is_floating_point():
        scaled = unit_scaled(array.float().mean(dim=0))
        colours = matplotlib.colormaps[FLOAT_IMAGE_CMAP](scaled.numpy())[..., :3]
        return (colours * 255).round().astype(np.uint8)
    if array.shape[0] == 3:
        return array.permute(1, 2, 0).numpy().astype(np.uint8)
    grey = array.float().mean(dim=0).round().clamp(0, 255).to(torch.uint8).numpy()
    return np.repeat(grey[:, :, None], 3, axis=2)


def _png(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    Image.fromarray(array).save(buffer, format="PNG")
    return buffer.getvalue()


def image_png(image: torch.Tensor) -> bytes:
    """The (C, H, W) input as a PNG, enlarged to at least `MIN_SIDE` pixels."""
    height, width = image.shape[-2:]
    shown = Image.fromarray(_rgb(image)).resize(_display_size(height, width)[::-1],
                                                Image.Resampling.NEAREST)
    return _png(np.asarray(shown))


def overlay_png(image: torch.Tensor, heat: torch.Tensor) -> bytes:
    """`heat` (gh, gw, values 0..1) upsampled over the (C, H, W) input, as a PNG."""
    height, width = _display_size(*image.shape[-2:])
    base = np.asarray(Image.fromarray(_rgb(image)).resize((width, height),
                                                          Image.Resampling.NEAREST))
    upsampled = F.interpolate(heat.float()[None, None], size=(height, width), mode="bilinear",
                              align_corners=False)[0, 0].clamp(0, 1).numpy()
    colours = matplotlib.colormaps["jet"](upsampled)[..., :3] * 255
    blended = (1 - ALPHA) * base.astype(np.float32) + ALPHA * colours
    return _png(blended.round().clip(0, 255).astype(np.uint8))


def data_url(png: bytes) -> str:
    """"data:image/png;base64,..." of PNG bytes: what an <img src> takes."""
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")
