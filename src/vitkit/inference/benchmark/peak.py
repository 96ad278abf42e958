"""The machine's matmul peak (fp32: the denominator of MFU, model FLOPs utilisation)."""

from __future__ import annotations

import time
from collections.abc import Callable

import torch

from vitkit.runtime import set_threads


def timed(fn: Callable[[], object]) -> float:
    """Seconds one call of `fn` takes."""
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


class MatmulPeak:
    """Best GFLOP/s of a square matmul in `dtype` (default fp32) on `threads` threads
    (default: torch's current setting). Sample it before and between timed runs too, so a busy
    moment at start-up does not lower the peak (and raise MFU)."""

    def __init__(self, threads: int | None = None, size: int = 2048, warmup: int = 3,
                 dtype: torch.dtype = torch.float32) -> None:
        set_threads(threads)
        self.size, self.samples, self.best, self.dtype = size, 0, float("inf"), dtype
        self.a, self.b = (torch.randn(size, size, dtype=dtype) for _ in range(2))
        for _ in range(warmup):
            self.a @ self.b

    def sample(self, reps: int) -> None:
        self.best = min([self.best, *(timed(lambda: self.a @ self.b) for _ in range(reps))])
        self.samples += reps

    @property
    def gflops(self) -> float:
        return 2 * self.size**3 / self.best / 1e9

    def describe(self) -> str:
        dtype = {torch.float32: "fp32", torch.bfloat16: "bf16"}.get(
            self.dtype, str(self.dtype).removeprefix("torch."))
        return f"{self.size}x{self.size} {dtype} matmul, best of {self.samples}"


def mfu(flops_per_image: float, images_per_s: float, peak_gflops: float) -> float:
    """Model FLOPs utilisation: achieved FLOP/s over the matmul peak."""
    return flops_per_image * images_per_s / (peak_gflops * 1e9)
