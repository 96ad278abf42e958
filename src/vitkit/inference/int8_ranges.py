"""How many bits torch's dynamic int8 gives activations and weights, chosen per CPU.

x86 int8 kernels without VNNI multiply uint8 activations by int8 weights and add each pair of
products in 16 bits (`vpmaddubsw`), which saturates when both sit near their ends
(2 x 255 x 128 > 32,767). torch avoids that on every CPU by quantising activations over 7 bits
(`reduce_range=True`). vitkit keeps the activations' 8 bits (they are quantised per batch, so
theirs is the larger error) and chooses by CPU (`int8_scheme`):

  "8-bit"          AVX512-VNNI (AMX CPUs have it too): products are summed in 32 bits, nothing
                   can saturate; weights as torch quantises them (per tensor, 8 bits).
  "7-bit weights"  other x86 CPUs with AVX2: weights per output channel over 7 bits, [-64, 63]
                   (2 x 255 x 64 = 32,640 fits in 16 bits).
  "torch"          anything else (ARM, flags not readable): torch's own 7-bit activations.

torch draws the same line for its static oneDNN qconfig (`get_default_qconfig("onednn")`):
8-bit activations, with a warning where `torch.cpu._is_vnni_supported()` (AVX512-VNNI) is false.

On the width-48 `cifar10-tutorial` model torch's 7-bit activations cost about a third of a
point of CIFAR-10 top-1, "8-bit" and "7-bit weights" a tenth of a point or less, each at
torch's speed (docs/speed.md).
"""

from __future__ import annotations

import warnings

import torch
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicInt8Linear

from vitkit.runtime import cpu_model_and_flags

__all__ = ["SCHEMES", "FullRangeInt8Linear", "describe_scheme", "int8_scheme", "quantize_linears"]

SCHEMES = ("8-bit", "7-bit weights", "torch")
_DESCRIPTIONS = {
    "8-bit": "8-bit activations and weights (AVX512-VNNI)",
    "7-bit weights": "8-bit activations, 7-bit weights per channel (AVX2 without VNNI)",
    "torch": "torch's 7-bit activations",
}
SEVEN_BIT_WEIGHTS = (-64, 63)


def int8_scheme(flags: frozenset[str] | None = None) -> str:
    """The scheme (one of SCHEMES) for a CPU with these /proc/cpuinfo `flags` (this one's by
    default)."""
    flags = cpu_model_and_flags()[1] if flags is None else flags
    if "avx512_vnni" in flags:
        return "8-bit"
    return "7-bit weights" if "avx2" in flags else "torch"


def describe_scheme(scheme: str | None = None) -> str:
    """`scheme` (this CPU's by default) in words: "8-bit activations and weights (AVX512-VNNI)"."""
    return _DESCRIPTIONS[int8_scheme() if scheme is None else scheme]


class FullRangeInt8Linear(DynamicInt8Linear):
    """torch's dynamic int8 Linear with its activations quantised over the full 8 bits
    (0-255) instead of 7."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(
            x, self._packed_params._packed_params, reduce_range=False).to(x.dtype)

    def _get_name(self) -> str:
        return "FullRangeDynamicQuantizedLinear"


def quantize_linears(model: nn.Module, scheme: str) -> nn.Module:
    """`model` with every `nn.Linear` swapped in place for dynamic int8 under `scheme`, its
    weights packed for the current `torch.backends.quantized.engine`."""
    from torch.ao import quantization

    if scheme not in SCHEMES:
        raise ValueError(f"unknown int8 scheme {scheme!r}: one of {', '.join(SCHEMES)}")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch.ao.quantization's deprecation notices
        if scheme == "torch":
            return quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8,
                                                 inplace=True)
        qconfig = quantization.default_dynamic_qconfig
        if scheme == "7-bit weights":
            low, high = SEVEN_BIT_WEIGHTS
            qconfig = quantization.QConfig(
                activation=quantization.default_dynamic_quant_observer,
                weight=quantization.PerChannelMinMaxObserver.with_args(
                    dtype=torch.qint8, qscheme=torch.per_channel_symmetric, quant_min=low,
                    quant_max=high))
        return quantization.quantize_dynamic(model, {nn.Linear: qconfig}, dtype=torch.qint8,
                                             mapping={nn.Linear: FullRangeInt8Linear},
                                             inplace=True)
