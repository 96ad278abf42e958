"""What a run trains in, `amp=auto|bf16|off`: bf16 autocast or fp32, chosen by the device, the
CPU's bf16 hardware and the model's width.

bf16 autocast pays where matmuls are large enough for bf16's speed to outweigh its casts: on
CUDA, and on a CPU with bf16 matmuls in hardware for a model at least `AMP_MIN_WIDTH` wide.
A CPU that shows AVX512-BF16 without AMX may still run bf16 slower than fp32, so there a bf16
matmul at the model's width is measured once per machine (`vitkit.inference.cpu_probes`).
Without bf16 hardware bf16 is emulated and slower. Measured steps per machine:
benchmarks/README.md (`benchmarks/amp_step.py`).
"""

from __future__ import annotations

import torch

from vitkit.inference.cpu_probes import (
    bf16_matmul_note,
    fast_bf16_cpu,
    measured_bf16_speedup,
    slow_bf16,
)
from vitkit.inference.precision import BF16_MARGIN, Precision

__all__ = ["AMP_MIN_WIDTH", "training_precision"]

AMP_MIN_WIDTH = 128  # bf16 training on a bf16 CPU pays from this width on


def training_precision(amp: str, device: torch.device, width: int,
                       flags: frozenset[str] | None = None) -> Precision:
    """What `amp=auto|bf16|off` trains in: bf16 with amp=bf16; with amp=auto, bf16 on CUDA,
    on a CPU with AMX for a model at least `AMP_MIN_WIDTH` wide, and on one with AVX512-BF16
    but no AMX where also a bf16 matmul at the model's width measures at least `BF16_MARGIN`
    faster (`measured_bf16_speedup`: remembered per machine, so the runs on one machine
    decide alike; the training set-up also makes the ranks agree and a resume keep its run's
    choice); else fp32. `flags`: the CPU's instruction sets (this one's when None)."""
    if amp == "bf16":
        slow = slow_bf16(device, width, flags)
        return Precision("bf16", f"amp=bf16; {slow}: amp=auto decides by the machine" if slow
                         else "amp=bf16")
    kind = fast_bf16_cpu(flags) if device.type == "cpu" else None
    if amp != "auto":
        return Precision("fp32", f"amp={amp}")
    if device.type == "cuda":
        return Precision("bf16", "amp=auto on CUDA: bf16 autocast")
    if device.type != "cpu":
        return Precision("fp32", f"amp=auto on {device.type}: fp32")
    if kind is None:
        return Precision("fp32", "amp=auto: this CPU has no bf16 matmuls in hardware (AMX or "
                                 "AVX512-BF16), so bf16 would be slower")
    hardware = "AMX" if kind == "amx" else "AVX512-BF16"
    if width < AMP_MIN_WIDTH:
        return Precision("fp32", f"amp=auto: width {width} < {AMP_MIN_WIDTH}, where bf16 casts "
                                 f"cost more than {hardware} saves")
    if kind == "amx":
        return Precision("bf16", f"amp=auto: the CPU has AMX and the model is {width} wide "
                                 f"(>= {AMP_MIN_WIDTH})")
    speedup = measured_bf16_speedup(width)
    if speedup < BF16_MARGIN:
        return Precision("fp32", f"amp=auto: {bf16_matmul_note(width, speedup)}, under the "
                                 f"{BF16_MARGIN}x bf16 must gain to pay for its casts")
    return Precision("bf16", f"amp=auto: the CPU has AVX512-BF16, a bf16 matmul at width "
                             f"{width} measured {speedup:.1f}x fp32 (>= {BF16_MARGIN}x) and the "
                             f"model is {width} wide (>= {AMP_MIN_WIDTH})")
