"""Timing a callable: warm-up calls, then per-call seconds of the timed calls."""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import dataclass

from vitkit.inference.benchmark.peak import timed


@dataclass(frozen=True)
class Timing:
    """Seconds of each timed call, and of the very first call (compilation, lazy set-up)."""

    seconds: list[float]
    first_call_s: float

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    def percentile(self, q: float) -> float:
        """The q-th percentile (0-100), linear between the closest ranks (numpy's default)."""
        ordered = sorted(self.seconds)
        rank = (len(ordered) - 1) * q / 100
        low = int(rank)
        high = min(low + 1, len(ordered) - 1)
        return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def time_calls(run: Callable[[], object], warmup: int, iters: int) -> Timing:
    """Call `run` once (timed apart: a compiled model compiles here), `warmup` more times
    untimed, then `iters` times, each timed."""
    first = timed(run)
    for _ in range(warmup):
        run()
    return Timing([timed(run) for _ in range(iters)], first)
