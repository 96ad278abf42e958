"""CPU memory: peak RSS growth around a run, the memory available, and the largest batch
that fits a memory cap (found on an estimate, without allocating it).

Peak RSS on Linux is exact: the kernel's high-water mark (VmHWM) is reset to the current
RSS by writing "5" to /proc/self/clear_refs, after freed heap memory is handed back to the
system (glibc's malloc_trim), so the growth is what the run itself needed. Elsewhere the
process's lifetime peak (getrusage) is used, which shows growth only when the run sets a new
peak: the result says which way it was measured.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import resource
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass

from vitkit.errors import ConfigError

_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"
MAX_BATCH = 1 << 20  # the search for the largest batch stops here


@dataclass
class PeakMemory:
    """Filled in when the `peak_rss_growth()` block ends."""

    bytes: int = 0
    method: str = ""

    @property
    def mib(self) -> float:
        return self.bytes / 2**20


def _status_kib(field: str) -> int | None:
    try:
        with open(_STATUS) as status:
            for line in status:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def _trim_heap() -> None:
    """Hand freed heap memory back to the system (glibc), so the baseline RSS is real."""
    name = ctypes.util.find_library("c")
    if name is None:
        return
    with suppress(OSError, AttributeError):
        ctypes.CDLL(name).malloc_trim(0)


def _reset_high_water_mark() -> bool:
    try:
        with open(_CLEAR_REFS, "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _lifetime_peak_bytes() -> int:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # bytes on macOS, KiB on Linux


@contextmanager
def peak_rss_growth() -> Iterator[PeakMemory]:
    """Measure how far the process's resident memory rises above its level at entry:

    >>> with peak_rss_growth() as peak:
    ...     run()
    >>> peak.mib
    """
    result = PeakMemory()
    _trim_heap()
    exact = _reset_high_water_mark() and _status_kib("VmHWM") is not None
    start = _status_kib("VmRSS") * 1024 if exact else _lifetime_peak_bytes()
    try:
        yield result
    finally:
        if exact:
            result.bytes = max(0, _status_kib("VmHWM") * 1024 - start)
            result.method = "peak RSS growth (kernel high-water mark, reset at start)"
        else:
            result.bytes = max(0, _lifetime_peak_bytes() - start)
            result.method = "growth of the process's lifetime peak RSS (0 if not a new peak)"


def available_memory_bytes() -> int:
    """Memory the system can give without swapping (psutil if installed, else
    /proc/meminfo's MemAvailable)."""
    try:
        import psutil
    except ImportError:
        psutil = None
    if psutil is not None:
        return int(psutil.virtual_memory().available)
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    pages = os.sysconf("SC_AVPHYS_PAGES") if hasattr(os, "sysconf") else 0
    if pages <= 0:
        raise ConfigError("cannot tell how much memory is available here: give the cap with "
                          "--memory-gb (e.g. --memory-gb 8), or pip install psutil")
    return pages * os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class LinearMemoryModel:
    """Memory of a run at batch b: fixed + per_image * b bytes, fitted from two measured
    batches."""

    fixed: float
    per_image: float

    @classmethod
    def fit(cls, batch_a: int, bytes_a: float, batch_b: int, bytes_b: float,
            min_per_image: float) -> LinearMemoryModel:
        """Through the two points; the slope is at least `min_per_image` (one image's own
        tensors), so a noisy measurement cannot promise unlimited batches."""
        slope = (bytes_b - bytes_a) / (batch_b - batch_a)
        slope = max(slope, min_per_image)
        return cls(max(0.0, bytes_a - slope * batch_a), slope)

    def __call__(self, batch: int) -> float:
        return self.fixed + self.per_image * batch


def largest_fitting_batch(needed_bytes: Callable[[int], float], cap_bytes: float) -> int:
    """The largest batch b with needed_bytes(b) <= cap_bytes: double from 1 until it no longer
    fits, then bisect between the last fit and the first miss. 0 when even 1 does not fit.
    `needed_bytes` must grow with b."""
    if needed_bytes(1) > cap_bytes:
        return 0
    fits = 1
    while fits < MAX_BATCH and needed_bytes(2 * fits) <= cap_bytes:
        fits *= 2
    if fits >= MAX_BATCH:
        return MAX_BATCH
    misses = 2 * fits
    while misses - fits > 1:
        middle = (fits + misses) // 2
        if needed_bytes(middle) <= cap_bytes:
            fits = middle
        else:
            misses = middle
    return fits
