"""`--compile` for inference: torch.compile (inductor) with the weights frozen.

Inference never changes the weights, so inductor may treat them as constants (its `freezing`
option): fold them into the graph and, on the CPU, pack Linear weights once in the layout
oneDNN's matmuls want, with bias and activation fused in, where eager autocast casts every
weight on every call. Load new weights into a new compile. Freezing applies to calls under
`torch.no_grad()` or `torch.inference_mode()`, as every inference verb runs; any other call
runs the graph unfrozen. Training compiles elsewhere (`vitkit.train.compiling`), without
freezing, since its weights change every step.

On the CPUs measured, no inference path runs clearly faster compiled than eager, and on some
the compiled paths run slower (`benchmarks/inference.py --compile`; its tables:
benchmarks/README.md).
"""

from __future__ import annotations

import torch
from torch import nn

from vitkit.runtime import check_compiler


def compile_for_inference(module: nn.Module, device: torch.device) -> nn.Module:
    """`module` under torch.compile with frozen weights (the first call compiles); refused
    clearly where the CPU has no C++ compiler for inductor's kernels."""
    check_compiler(device, "--compile", "drop --compile")
    return torch.compile(module, options={"freezing": True})
