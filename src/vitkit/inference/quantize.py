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
                 (`vitkit.inference.precision.choose_int8_engine`); the default.

Each engine's speed on this machine is printed by `benchmarks/int8_engines.py`; docs/speed.md
quotes it per CPU.

torch's dynamic int8 Linear quantises activations to 7 bits (`reduce_range=True`), so that the
16-bit pairwise sums of AVX2's int8 instruction cannot saturate. CPUs with AVX512-VNNI (AMX
CPUs have it too) accumulate int8 products in 32 bits, and there "torch" and "onednn" run
`FullRangeInt8Linear`, activations over all 8 bits: on the width-48 `cifar10-tutorial` model
the top-1 cost fell from 0.33-0.34 to 0.03-0.07 points, at the same speed (docs/speed.md).
This is the rule torch applies to its own oneDNN static qconfig.
"""

from __future__ import annotations

import copy
import importlib
import importlib.util
import sys
import warnings
from typing import Any

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from vitkit.errors import ConfigError
from vitkit.runtime import cpu_model_and_flags

ENGINES = ("torch", "onednn", "onnxruntime", "torchao")
AUTO = "auto"
DEFAULT = AUTO  # measured per machine and model
TORCHAO_HINT = "pip install 'vitkit[int8]' (or pip install torchao)"
# The CPU flag (as /proc/cpuinfo names it) under which 8-bit activations cannot saturate.
FULL_RANGE_FLAG = "avx512_vnni"

__all__ = ["AUTO", "DEFAULT", "ENGINES", "FullRangeInt8Linear", "available_engines",
           "full_range_activations", "int8_engine", "quantize_int8"]


class FullRangeInt8Linear(DynamicInt8Linear):
    """torch's dynamic int8 Linear with its activations quantised over the full 8 bits
    (0-255) instead of 7; for CPUs with AVX512-VNNI (`full_range_activations`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(
            x, self._packed_params._packed_params, reduce_range=False).to(x.dtype)

    def _get_name(self) -> str:
        return "FullRangeDynamicQuantizedLinear"


def full_range_activations() -> bool:
    """Whether this CPU's int8 dot products accumulate in 32 bits (AVX512-VNNI), so that the
    "torch" and "onednn" engines may quantise activations to 8 bits rather than 7."""
    return FULL_RANGE_FLAG in cpu_model_and_flags()[1]


def _require_torchao() -> Any:
    try:
        return importlib.import_module("torchao.quantization")
    except ImportError as exc:
        raise ConfigError(f"int8 engine 'torchao' needs the torchao package, which is not "
                          f"installed: {TORCHAO_HINT}, or use engine 'torch' (built into "
                          "torch)") from exc


def available_engines(model: nn.Module | None = None) -> list[str]:
    """The int8 engines this install can run `model` with: torch always, onednn where torch
    was built with it, onnxruntime where onnx/onnxruntime are installed and the model has no
    token merging (the exported graph has a fixed token count), torchao where installed."""
    from vitkit.inference.onnx_int8 import onnxruntime_available

    engines = ["torch"]
    if "onednn" in torch.backends.quantized.supported_engines:
        engines.append("onednn")
    merged = any(getattr(block, "merge_r", 0) for block in getattr(model, "blocks", []))
    if onnxruntime_available() and not merged:
        engines.append("onnxruntime")
    if installed("torchao"):
        engines.append("torchao")
    return engines


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
    model's shape by `choose_int8_engine`).

    The copy keeps the model's class and attributes (config, preprocessing, class names,
    token merging), so it predicts and evaluates like the original; the stem's convolutions,
    LayerNorms and position embeddings stay float32. `model` is unchanged. "torch" and
    "onednn" quantise activations to 8 bits where the CPU has AVX512-VNNI, else to 7.
    """
    if engine == AUTO:
        engine = _fastest_engine(model)
    if engine not in ENGINES:
        raise ConfigError(f"unknown int8 engine {engine!r}: use one of {', '.join(ENGINES)} "
                          f"or {AUTO!r} (the fastest, measured)")
    device = next(model.parameters()).device
    if device.type != "cpu":
        raise ConfigError(f"int8 quantisation runs on the CPU, but the model is on {device}; "
                          "move it with model.cpu() first")
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
    mapping = {nn.Linear: FullRangeInt8Linear} if full_range_activations() else None
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
            return torch.ao.quantization.quantize_dynamic(
                copy.deepcopy(model).float().eval(), {nn.Linear}, dtype=torch.qint8,
                mapping=mapping)
    finally:  # the weights stay packed for their engine; the global setting is restored
        torch.backends.quantized.engine = before


def _fastest_engine(model: nn.Module) -> str:
    from vitkit.inference.precision import choose_int8_engine, measurement_batch

    config = model.config
    return choose_int8_engine(model, measurement_batch(config.in_chans, config.img_size, 8))[0]


def int8_engine(int8: bool, engine: str | None = None) -> str | None:
    """The engine `--int8 [--int8-engine E]` asks for (E implies int8; "auto" by default), or
    None for float."""
    return engine or (DEFAULT if int8 else None)
