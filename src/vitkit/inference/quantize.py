"""Dynamic int8 quantisation for CPU inference: the Linear layers' weights stored as int8,
activations quantised per batch on the fly.

Engines, measured on B/16 at 224 (2 shared CPU cores, torch 2.14, torchao 0.18; time vs fp32
eager, same run, interleaved):
  "torch"    torch's eager `torch.ao.quantization.quantize_dynamic` (x86/fbgemm kernels): the
             default; 2.5x faster at batch 8, 1.7x at batch 1; nothing to install.
  "torchao"  torchao's `Int8DynamicActivationInt8WeightConfig` (`pip install 'vitkit[int8]'`):
             slower than fp32 in eager mode here (0.7x) but about half the logit error of
             "torch" (max |diff| 0.06 vs 0.14); kept for that.
For ONNX files, `vitkit.export.quantize_onnx_int8` runs ONNX Runtime's `quantize_dynamic` on an
exported graph (`vitkit export --int8`): the fastest of all here, 3.1x (batch 8) and 4.7x
(batch 1) vs fp32 eager torch.
"""

from __future__ import annotations

import copy
import importlib
import warnings
from typing import Any

import torch
from torch import nn

from vitkit.errors import ConfigError

ENGINES = ("torch", "torchao")
DEFAULT = "torch"
TORCHAO_HINT = "pip install 'vitkit[int8]' (or pip install torchao)"

__all__ = ["DEFAULT", "ENGINES", "int8_engine", "quantize_int8"]


def _require_torchao() -> Any:
    try:
        return importlib.import_module("torchao.quantization")
    except ImportError as exc:
        raise ConfigError(f"int8 engine 'torchao' needs the torchao package, which is not "
                          f"installed: {TORCHAO_HINT}, or use engine '{DEFAULT}' (built into "
                          "torch)") from exc


def quantize_int8(model: nn.Module, engine: str = DEFAULT) -> nn.Module:
    """A copy of `model` in eval mode with every `nn.Linear` quantised to dynamic int8 (CPU).

    The copy keeps the model's class and attributes (config, preprocessing, class names,
    token merging), so it predicts and evaluates like the original; the patch embedding
    (a convolution), LayerNorms and position embeddings stay float32. `model` is unchanged.
    """
    if engine not in ENGINES:
        raise ConfigError(f"unknown int8 engine {engine!r}: use one of {', '.join(ENGINES)} "
                          f"(default {DEFAULT!r})")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(f"int8 quantisation runs on the CPU, but the model is on {device}; "
                          "move it with model.cpu() first")
    if engine == "torchao":
        quantization = _require_torchao()
        quantized = copy.deepcopy(model).float().eval()
        quantization.quantize_(quantized, quantization.Int8DynamicActivationInt8WeightConfig())
        return quantized
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notice
        return torch.ao.quantization.quantize_dynamic(copy.deepcopy(model).float().eval(),
                                                      {nn.Linear}, dtype=torch.qint8)


def int8_engine(int8: bool, engine: str | None = None) -> str | None:
    """The engine `--int8 [--int8-engine E]` asks for (E implies int8), or None for float."""
    return engine or (DEFAULT if int8 else None)
