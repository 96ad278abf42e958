"""The inference speed paths in one call, in the order they compose: token merging, then
int8. Used by `vitkit.inference.predictor.Predictor` (which eval, predict, serve and benchmark
build: `--merge-tokens R`), and by `vitkit export --merge-tokens R` (`export_merged`)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch import nn

from vitkit.inference.merging import apply_token_merging, check_merge_count
from vitkit.inference.quantize import quantize_int8
from vitkit.model.vit import VisionTransformer

if TYPE_CHECKING:
    from vitkit.report import Report

__all__ = ["export_merged", "speed_up"]


def speed_up(model: VisionTransformer, merge_tokens: int = 0,
             int8: str | None = None) -> nn.Module:
    """`model` with `merge_tokens` tokens merged per layer (in place; 0: none) and, when
    `int8` names an engine ("torch", "torchao"), a dynamic int8 copy of it. A
    `merge_tokens` larger than the model can merge is refused (`check_merge_count`)."""
    if merge_tokens:
        check_merge_count(model.config, merge_tokens)
        apply_token_merging(model, merge_tokens)
    return quantize_int8(model, int8) if int8 else model


def export_merged(weights: str, out: str | Path | None = None, *, merge_tokens: int = 0,
                  **options: Any) -> Report:
    """`vitkit export`: `vitkit.export.export_weights(weights, out, **options)` (format, int8,
    dynamic_size, opset, weights_dir) of the model with `merge_tokens` tokens merged per layer
    (0: none), so the graph merges as the model does, at its image size. Token merging is one
    of this package's speed paths and `vitkit.export` sits below it, so the two meet here."""
    from functools import partial

    from vitkit.export import export_weights

    merging = partial(speed_up, merge_tokens=merge_tokens) if merge_tokens else None
    return export_weights(weights, out, prepare=merging, **options)
