"""Int8 for CPU inference in one call: `quantize_int8(model, engine)` is a copy of the model
with its Linear layers in dynamic int8 by a named engine (`vitkit.inference.int8_engines`),
or by "auto", the fastest measured on the model here as `--precision int8` measures it
(`vitkit.inference.precision`). `int8_engine` is the engine the `--int8` flags ask for.
"""

from __future__ import annotations

import torch
from torch import nn

from vitkit.inference.int8_engines import AUTO, DEFAULT, quantize_by_engine, require_cpu
from vitkit.inference.precision import measurement_batch, run_in_precision

__all__ = ["int8_engine", "quantize_int8"]


def quantize_int8(model: nn.Module, engine: str = "torch") -> nn.Module:
    """A copy of `model` in eval mode with every `nn.Linear` in dynamic int8 (CPU), by
    `engine` (one of `vitkit.inference.int8_engines.ENGINES`, or "auto": the fastest,
    measured on random images of the model's shape as `--precision int8` measures it).

    The copy keeps the model's class and attributes (config, preprocessing, class names,
    token merging), so it predicts and evaluates like the original; the stem's convolutions,
    LayerNorms and position embeddings stay float32. `model` is unchanged.
    """
    if engine != AUTO:
        return quantize_by_engine(model, engine)
    require_cpu(model)
    config = model.config
    batch = measurement_batch(config.in_chans, config.img_size, 8)
    return run_in_precision("int8", torch.device("cpu"), model, batch)[0]


def int8_engine(int8: bool, engine: str | None = None) -> str | None:
    """The engine `--int8 [--int8-engine E]` asks for (E implies int8; "auto" by default), or
    None for float."""
    return engine or (DEFAULT if int8 else None)
