"""`compile=true`: the model the training steps call, under `torch.compile` (inductor).

Only the training steps run compiled; the plain module stays what checkpoints, evaluation and
the EMA see, so saved state dicts keep their plain keys (no `_orig_mod.` prefix). Shapes are
static: a new image size (progressive resizing) or batch shape compiles once more, instead of
switching to slower dynamic-shape kernels.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from vitkit.runtime import check_compiler


def compile_for_training(model: nn.Module, device: torch.device) -> nn.Module:
    """`model` compiled with static shapes; refused clearly when inductor cannot build CPU
    kernels here (no C/C++ compiler on the PATH)."""
    check_compiler(device, "compile=true", "set compile=false")
    return torch.compile(model, dynamic=False)


class CompileClock:
    """Seconds spent in steps that compiled: the first step of each new input shape.

    Those seconds are wall time like any other (the run's time budget counts them); they are
    kept apart so step-time estimates (fitting the schedule to the budget) leave them out.
    """

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.seconds = 0.0
        self._shapes: set[tuple[int, ...]] = set()
        self._start: float | None = None

    def start(self, shape: torch.Size) -> None:
        """Call before a step on inputs of `shape`: it is timed when the shape is new."""
        key = tuple(shape)
        if self.enabled and key not in self._shapes:
            self._shapes.add(key)
            self._start = time.perf_counter()

    def stop(self) -> None:
        if self._start is not None:
            self.seconds += time.perf_counter() - self._start
            self._start = None
