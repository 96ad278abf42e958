"""Int8 for CPU inference: the Linear layers' weights stored as int8, activations quantised
per batch on the fly, by one of four engines.

  "torch"        torch's eager `quantize_dynamic` with its x86 (fbgemm) kernels.
  "onednn"       the same with weights packed for oneDNN, whose int8 kernels use VNNI and AMX
                 where the CPU has them.
  "onnxruntime"  the model exported to ONNX and quantised by ONNX Runtime's `quantize_dynamic`,
                 run in an ONNX Runtime session (`vitkit.inference.onnx_int8`; needs
                 `pip install 'vitkit[export]'`).
  "torchao"      torchao's `Int8DynamicActivationInt8WeightConfig` (`pip install 'vitkit[int8]'`).
  "auto"         the fastest of those installed, measured on the model at the batch size
                 as `--precision int8` measures it (`vitkit.inference.precision`); the
                 default.

Each engine's speed on this machine is printed by `benchmarks/int8_engines.py`; docs/speed.md
quotes it per CPU.

"torch" and "onednn" quantise activations over 8 bits where torch uses 7, with the weights'
bits chosen per CPU so that no kernel can saturate (`vitkit.inference.int8_ranges`).
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
from typing import Any

import torch
from torch import nn

from vitkit.errors import ConfigError
from vitkit.inference.int8_ranges import describe_scheme, int8_scheme, quantize_linears

ENGINES = ("torch", "onednn", "onnxruntime", "torchao")
AUTO = "auto"
DEFAULT = AUTO  # measured per machine and model
TORCHAO_HINT = "pip install 'vitkit[int8]' (or pip install torchao)"

__all__ = ["AUTO", "DEFAULT", "ENGINES", "available_engines", "engine_scheme", "int8_engine",
           "quantize_int8"]


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
    from vitkit.inference.onnx_int8 import onnxruntime_available

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


def installed(module: str) -> bool:
    """Whether `module` can be imported (False too where sys.modules blocks it with None)."""
    try:
        return sys.modules.get(module, True) is not None and \
            importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def quantize_int8(model: nn.Module, engine: str = "torch") -> nn.Module:
    """A copy of `model` in eval mode with every `nn.Linear` in dynamic int8 (CPU), by
    `engine` (one of ENGINES, or "auto": the fastest, measured on random images of the
    model's shape as `--precision int8` measures it, `_by_fastest_engine`).

    The copy keeps the model's class and attributes (config, preprocessing, class names,
    token merging), so it predicts and evaluates like the original; the stem's convolutions,
    LayerNorms and position embeddings stay float32. `model` is unchanged. "torch" and
    "onednn" quantise by this CPU's `vitkit.inference.int8_ranges.int8_scheme`.
    """
    if engine not in (*ENGINES, AUTO):
        raise ConfigError(f"unknown int8 engine {engine!r}: use one of {', '.join(ENGINES)} "
                          f"or {AUTO!r} (the fastest, measured)")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(f"int8 quantisation runs on the CPU, but the model is on {device}; "
                          "move it with model.cpu() first")
    if engine == AUTO:
        return _by_fastest_engine(model)
    if engine == "torchao":
        quantization = _require_torchao()
        quantized = copy.deepcopy(model).float().eval()
        quantization.quantize_(quantized, quantization.Int8DynamicActivationInt8WeightConfig())
        return quantized
    if engine == "onnxruntime":
        from vitkit.inference.onnx_int8 import OnnxRuntimeInt8

        return OnnxRuntimeInt8(copy.deepcopy(model).float().eval())
    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = "onednn" if engine == "onednn" else before
    try:
        return quantize_linears(copy.deepcopy(model).float().eval(), int8_scheme())
    finally:  # the weights stay packed for their engine; the global setting is restored
        torch.backends.quantized.engine = before


def _by_fastest_engine(model: nn.Module) -> nn.Module:
    """`model` in int8 by the engine `--precision int8` measures fastest on 8 random images of
    its shape (`vitkit.inference.precision.run_in_precision`)."""
    from vitkit.inference.precision import measurement_batch, run_in_precision

    config = model.config
    batch = measurement_batch(config.in_chans, config.img_size, 8)
    return run_in_precision("int8", torch.device("cpu"), model, batch)[0]


def int8_engine(int8: bool, engine: str | None = None) -> str | None:
    """The engine `--int8 [--int8-engine E]` asks for (E implies int8; "auto" by default), or
    None for float."""
    return engine or (DEFAULT if int8 else None)
