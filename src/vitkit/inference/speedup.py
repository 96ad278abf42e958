"""The inference speed paths in one call, in the order they compose: token merging, then
int8. Used by `vitkit eval` and `vitkit predict` (`--merge-tokens R --int8`)."""

from __future__ import annotations

from torch import nn

from vitkit.inference.merging import apply_token_merging, check_merge_count
from vitkit.inference.quantize import quantize_int8
from vitkit.model.vit import VisionTransformer

__all__ = ["speed_up"]


def speed_up(model: VisionTransformer, merge_tokens: int = 0,
             int8: str | None = None) -> nn.Module:
    """`model` with `merge_tokens` tokens merged per layer (in place; 0: none) and, when
    `int8` names an engine ("torch", "torchao"), a dynamic int8 copy of it. A
    `merge_tokens` larger than the model can merge is refused (`check_merge_count`)."""
    if merge_tokens:
        check_merge_count(model.config, merge_tokens)
        apply_token_merging(model, merge_tokens)
    return quantize_int8(model, int8) if int8 else model
