"""Inference speed paths that keep `vitkit.model` plain: token merging (`merging`), dynamic
int8 (`quantize`), both in one call (`speed_up`), and `vitkit benchmark` (`benchmark`)."""

from vitkit.inference.merging import apply_token_merging
from vitkit.inference.quantize import quantize_int8
from vitkit.inference.speedup import speed_up

__all__ = ["apply_token_merging", "quantize_int8", "speed_up"]
