"""Dynamic int8 quantisation for CPU inference: the Linear layers' weights stored as int8,
activations quantised per batch on the fly.

Engines, measured on B/16 at 224 (2 shared CPU cores, torch 2.14, torchao 0.18; time vs fp32
eager, same run, interleaved):
  "torch"    torch's eager `torch.ao.quantization.quantize_dynamic` (x86/fbgemm kernels): the
             default; 2.5x faster at batch 8, 1.7x at batch 1; nothing to install.
  "torchao"  torchao's `Int8DynamicActivationInt8WeightConfig` (`pip install 'vitkit[int8]'`):
             slower than fp32 in eager mode here (0.7x) but about half the logit error of
             "torch" (max |diff| 0.06 vs 0.14); kept for that.
For ONNX files, `quantize_onnx_int8` runs ONNX Runtime's `quantize_dynamic` on an exported graph
(`vitkit export --int8`): the fastest of all here, 3.1x (batch 8) and 4.7x (batch 1) vs fp32
eager torch.
"""

from __future__ import annotations

import copy
import importlib
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vitkit.errors import ConfigError, ExportError

ENGINES = ("torch", "torchao")
DEFAULT = "torch"
TORCHAO_HINT = "pip install 'vitkit[int8]' (or pip install torchao)"

__all__ = ["DEFAULT", "ENGINES", "quantize_int8", "quantize_onnx_int8"]


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


def quantize_onnx_int8(source: str | Path, target: str | Path) -> Path:
    """Write `source` (an fp32 ONNX file) to `target` with ONNX Runtime's dynamic int8
    quantisation (int8 weights of MatMul/Gemm, per-tensor), metadata_props kept."""
    try:
        quantization = importlib.import_module("onnxruntime.quantization")
        onnx = importlib.import_module("onnx")
    except ImportError as exc:
        raise ExportError("int8 ONNX export needs onnx and onnxruntime, which are not "
                          "installed: pip install 'vitkit[export]'") from exc
    target = Path(target)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "please run pre-processing" advice
        quantization.quantize_dynamic(str(source), str(target),
                                      weight_type=quantization.QuantType.QInt8)
    original = onnx.load(str(source), load_external_data=False)
    proto = onnx.load(str(target), load_external_data=False)
    present = {entry.key for entry in proto.metadata_props}
    for entry in original.metadata_props:
        if entry.key not in present:
            proto.metadata_props.add(key=entry.key, value=entry.value)
    proto.metadata_props.add(key="quantization",
                             value='"dynamic int8 (onnxruntime.quantization.quantize_dynamic)"')
    onnx.save(proto, str(target))
    return target
