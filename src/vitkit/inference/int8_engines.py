"""The int8 engines for CPU inference: the Linear layers' weights stored as int8, activations
quantised per batch on the fly.

  "torch"        torch's eager `quantize_dynamic` with its x86 (fbgemm) kernels.
  "onednn"       the same with weights packed for oneDNN, whose int8 kernels use VNNI and AMX
                 where the CPU has them.
  "onnxruntime"  the model exported to ONNX and quantised by ONNX Runtime's `quantize_dynamic`,
                 run in an ONNX Runtime session (`vitkit.inference.onnx_int8`; needs
                 `pip install 'vitkit[export]'`).
  "torchao"      torchao's `Int8DynamicActivationInt8WeightConfig` (`pip install 'vitkit[int8]'`).

`AUTO` names none of them: the fastest installed, measured on the model
(`vitkit.inference.quantize.quantize_int8`, `vitkit.inference.int8_choice`). This module says
which engines exist (`ENGINES`), which this install runs (`available_engines`) and quantises
by a named one (`quantize_by_engine`). Each engine's speed on a machine is printed by
`benchmarks/inference.py` (benchmarks/README.md).

"torch" and "onednn" quantise activations over 8 bits where torch uses 7, with the weights'
bits chosen per CPU so that no kernel can saturate (`vitkit.inference.int8_ranges`).
"""

from __future__ import annotations

import copy
import importlib
from typing import Any

import torch
from torch import nn

from vitkit.errors import ConfigError
from vitkit.inference.int8_ranges import describe_scheme, int8_scheme, quantize_linears
from vitkit.inference.onnx_int8 import OnnxRuntimeInt8, onnxruntime_available
from vitkit.runtime import installed

ENGINES = ("torch", "onednn", "onnxruntime", "torchao")
AUTO = "auto"
DEFAULT = AUTO  # measured per machine and model
TORCHAO_HINT = "pip install 'vitkit[int8]' (or pip install torchao)"

__all__ = ["AUTO", "DEFAULT", "ENGINES", "available_engines", "engine_scheme",
           "quantize_by_engine", "require_cpu"]


def _require_torchao() -> Any:
    try:
        return importlib.import_module("torchao.quantization")
    except ImportError as exc:
        raise ConfigError(f"int8 engine 'torchao' needs the torchao package, which is not "
                          f"installed: {TORCHAO_HINT}, or use engine 'torch' (built into "
                          "torch)") from exc


def available_engines() -> list[str]:
    """The int8 engines this install runs, each with token merging too: torch always, onednn
    where torch was built with it, onnxruntime where onnx/onnxruntime are installed, torchao
    where installed."""
    engines = ["torch"]
    if "onednn" in torch.backends.quantized.supported_engines:
        engines.append("onednn")
    if onnxruntime_available():
        engines.append("onnxruntime")
    if installed("torchao"):
        engines.append("torchao")
    return engines


def engine_scheme(engine: str | None) -> str | None:
    """How `engine` quantises on this CPU, in words, for the engines that follow
    `vitkit.inference.int8_ranges` ("torch", "onednn"); None for the others."""
    return describe_scheme() if engine in ("torch", "onednn") else None


def _torch_engines() -> str:
    """"--int8-engine torch", with "(or onednn)" where torch was built with oneDNN: the
    engines built into torch, the fix where another engine cannot run a model."""
    return "--int8-engine torch" + (" (or onednn)" if "onednn" in available_engines() else "")


def require_cpu(model: nn.Module) -> None:
    """Refuse a model that is not on the CPU, where every int8 engine runs."""
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(f"int8 quantisation runs on the CPU, but the model is on {device}; "
                          "move it with model.cpu() first")


def quantize_by_engine(model: nn.Module, engine: str) -> nn.Module:
    """A copy of `model` in eval mode with every `nn.Linear` in dynamic int8 (CPU), by
    `engine` (one of ENGINES).

    The copy keeps the model's class and attributes (config, preprocessing, class names,
    token merging), so it predicts and evaluates like the original; the stem's convolutions,
    LayerNorms and position embeddings stay float32. `model` is unchanged. "torch" and
    "onednn" quantise by this CPU's `vitkit.inference.int8_ranges.int8_scheme`.
    """
    if engine == AUTO:
        raise ConfigError(f"int8 engine {AUTO!r} is chosen by measuring: "
                          "vitkit.inference.quantize_int8(model, 'auto')")
    if engine not in ENGINES:
        raise ConfigError(f"unknown int8 engine {engine!r}: use one of {', '.join(ENGINES)} "
                          f"or {AUTO!r} (the fastest, measured)")
    require_cpu(model)
    if engine == "torchao":
        quantization = _require_torchao()
        quantized = copy.deepcopy(model).float().eval()
        quantization.quantize_(quantized, quantization.Int8DynamicActivationInt8WeightConfig())
        return quantized
    if engine == "onnxruntime":
        return OnnxRuntimeInt8(copy.deepcopy(model).float().eval(), others=_torch_engines())
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = "onednn" if engine == "onednn" else before
    try:
        return quantize_linears(copy.deepcopy(model).float().eval(), int8_scheme())
    finally:  # the weights stay packed for their engine; the global setting is restored
        torch.backends.quantized.engine = before
