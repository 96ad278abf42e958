"""Learning-rate schedules as plain functions of the step: linear warmup, then cosine."""

from __future__ import annotations

import math


def warmup_cosine(step: int, total_steps: int, warmup_steps: int, min_ratio: float = 0.0
                  ) -> float:
    """Multiplier of the base LR: 0 -> 1 linearly over `warmup_steps`, then cosine to
    `min_ratio` at `total_steps` (and held there after)."""
    if warmup_steps and step < warmup_steps:
        return (step + 1) / warmup_steps
    span = max(total_steps - warmup_steps, 1)
    progress = min(max(step - warmup_steps, 0) / span, 1.0)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


def constant(step: int, total_steps: int, warmup_steps: int, min_ratio: float = 0.0) -> float:
    """No schedule after the warmup (the CIFAR-10 tutorial's setting)."""
    return (step + 1) / warmup_steps if warmup_steps and step < warmup_steps else 1.0


SCHEDULES = {"cosine": warmup_cosine, "constant": constant}
