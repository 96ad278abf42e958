"""What every adapter shares: the read options, the training resolution of a file whose
position table does not say it (a non-square grid), and the wording for a damaged file."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitkit.errors import CheckpointError

Size = int | tuple[int, int]


@dataclass(frozen=True)
class ReadOptions:
    """What a reader may need beyond the file.

    `source_img_size`: the training resolution of a file with a non-square position grid.
    `img_size`: the size the model will be built at; taken as the training resolution of a
    non-square file when its token count matches. `num_heads` / `global_pool`: complete
    timm state dicts whose shapes leave them open.
    """

    source_img_size: Size | None = None
    img_size: Size | None = None
    num_heads: int | None = None
    global_pool: str | None = None

    def timm_hints(self) -> dict[str, Any]:
        hints = {"num_heads": self.num_heads, "global_pool": self.global_pool}
        return {k: v for k, v in hints.items() if v is not None}


def _pair(size: Size) -> tuple[int, int]:
    return (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))


def training_image_size(num_patches: int, patch: int, source_img_size: Size | None = None,
                        img_size: Size | None = None) -> Size:
    """The image size a position table of `num_patches` rows was trained at.

    `source_img_size` when given; else the square grid; else `img_size` when its grid has
    `num_patches` cells. Otherwise the error lists the sizes that fit and the call to make.
    """
    if source_img_size is not None:
        return source_img_size
    side = math.isqrt(num_patches)
    if side * side == num_patches:
        return side * patch
    if img_size is not None:
        height, width = _pair(img_size)
        if not (height % patch or width % patch) and \
                (height // patch) * (width // patch) == num_patches:
            return (height, width)
    grids = [(rows, num_patches // rows) for rows in range(1, num_patches + 1)
             if num_patches % rows == 0]
    grids.sort(key=lambda g: (abs(g[0] - g[1]), g[0]))
    sizes = ", ".join(f"({rows * patch}, {cols * patch})" for rows, cols in grids[:6])
    example = (grids[0][0] * patch, grids[0][1] * patch)
    raise CheckpointError(
        f"{num_patches} position embeddings do not form a square grid, so the file does not "
        f"say its training resolution: pass it as source_img_size=(height, width), e.g. "
        f"load_pretrained(path, source_img_size={example}). Sizes whose {patch}-px patch grid "
        f"has {num_patches} cells: {sizes}. img_size=(height, width) alone works as well when "
        "the model is to keep that resolution.")


AGAIN = "download or copy it again"  # `damaged`'s fix, for a file that came from elsewhere


def damaged(path: str | Path, why: str) -> CheckpointError:
    """The one wording for a file whose bytes fail a check."""
    return CheckpointError(f"{path} is damaged ({why}): {AGAIN}")


def with_fix(error: CheckpointError, fix: str) -> CheckpointError:
    """`damaged`'s error with `fix` in place of its "download or copy it again" (a file with
    a better way out, such as a run's other checkpoint); another error as it is."""
    text = str(error)
    return CheckpointError(text[:-len(AGAIN)] + fix) if text.endswith(f": {AGAIN}") else error
