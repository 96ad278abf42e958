"""How learned position embeddings follow a new image size when weights are loaded.

Each convention reproduces the numbers of one reference code (checked in their sources):

- "official": bilinear, corners aligned, no antialiasing. The original vit_jax
  (`vit_jax/checkpoint.py`, `load_pretrained`) and big_vision (`models/vit.py`,
  `resample_posemb`) both call `scipy.ndimage.zoom(grid, (new/old, new/old, 1), order=1)`,
  whose default `grid_mode=False` maps the corner samples onto each other; the class token's
  row is kept as is. Default for official .npz files.
- "timm": bicubic, half-pixel centres (align_corners=False), antialiased. The defaults of
  timm's `resample_abs_pos_embed`, which its `checkpoint_filter_fn` uses for timm files.
  Default for timm files.
- "bilinear": bilinear, half-pixel centres, no antialiasing: what timm's own reader of the
  official .npz files (`_load_weights`) does. Default for vitkit's training checkpoints and
  for vitkit folders that record no convention; a folder written by `save_pretrained` records
  the convention of the weights it was built from (an .npz's "official", a timm file's
  "timm", ...), and that is its default.
- "bicubic": bicubic, half-pixel centres, no antialiasing: Hugging Face ViT's
  `interpolate_pos_encoding` (`ViTEmbeddings`: `interpolate(..., size=(h, w),
  mode="bicubic", align_corners=False)`), which HF runs when a model reads another size
  (checked against transformers 5.24; older releases resized by a scale factor with a 0.1
  offset, which this does not reproduce).
  Default for Hugging Face files: within 2e-7 of HF's logits at 48 and 16 px, where "timm"
  is 4e-4 and 1.8e-3 off (tests/weights/test_parity_hf.py).

"auto" (or None) picks the default for the record's origin, or the convention its folder
records.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from torch import nn

from vitkit.errors import ConfigError

log = logging.getLogger("vitkit.weights")


@dataclass(frozen=True)
class PosResampling:
    """One resampling convention: the arguments of `model.posembed.resample_grid_embed`."""

    name: str
    mode: str
    align_corners: bool
    antialias: bool

    def describe(self) -> str:
        """"bilinear, corners aligned" / "bicubic, half-pixel, antialiased"."""
        corners = "corners aligned" if self.align_corners else "half-pixel"
        return f"{self.mode}, {corners}" + (", antialiased" if self.antialias else "")


CONVENTIONS: dict[str, PosResampling] = {
    "official": PosResampling("official", "bilinear", align_corners=True, antialias=False),
    "timm": PosResampling("timm", "bicubic", align_corners=False, antialias=True),
    "bilinear": PosResampling("bilinear", "bilinear", align_corners=False, antialias=False),
    "bicubic": PosResampling("bicubic", "bicubic", align_corners=False, antialias=False),
}
POS_INTERPOLATIONS = ("auto", *CONVENTIONS)
DEFAULT_BY_ORIGIN = {"npz": "official", "timm": "timm", "huggingface": "bicubic",
                     "vitkit": "bilinear", "vitkit-train": "bilinear"}


def check_pos_interpolation(name: str | None) -> None:
    """Refuse an unknown convention name, listing the known ones."""
    if name is not None and name not in POS_INTERPOLATIONS:
        raise ConfigError(f"pos_interpolation={name!r}: use one of "
                          f"{', '.join(POS_INTERPOLATIONS)} ('official': bilinear with corners "
                          "aligned as vit_jax; 'timm': bicubic, antialiased; 'auto': the one "
                          "of the weights' format)")


def resolve(name: str | None, origin: str, recorded: str | None = None) -> PosResampling:
    """The convention `name` names; "auto"/None: the one the weights record (`recorded`, a
    vitkit folder's), else the default for weights of `origin`."""
    check_pos_interpolation(name)
    if name in (None, "auto"):
        name = recorded or DEFAULT_BY_ORIGIN[origin]
    return CONVENTIONS[name]


def resize_model(model: nn.Module, img_size: int | tuple[int, int],
                 resampling: PosResampling) -> None:
    """`model.set_image_size` with `resampling`, logging one line when positions move."""
    old = model.config.grid_size
    model.set_image_size(img_size, mode=resampling.mode, align_corners=resampling.align_corners,
                         antialias=resampling.antialias)
    new = model.config.grid_size
    if old != new and isinstance(model.pos_embed, nn.Parameter):
        log.info("position embeddings resampled %dx%d -> %dx%d, %s (%s)", *old, *new,
                 resampling.describe(), resampling.name)
