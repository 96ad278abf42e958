"""Process settings that make CPU training and inference faster.

glibc returns large freed blocks to the operating system at once, so every training step
allocates its activations on fresh pages and pays ~100k page faults (measured here on a
width-192 ViT step: 415 MB of faults, 180 ms of system time per ~1 s step). Keeping freed
memory in the process removes that cost; peak memory is unchanged, it is simply not given
back between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os

import torch

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD_MAX = 32 * 1024 * 1024  # glibc's upper limit on 64-bit systems
_tuned = False


def tune_cpu_allocator() -> bool:
    """Keep freed blocks up to 32 MiB in the heap instead of unmapping them (glibc only).

    Returns True when the setting took effect; elsewhere (musl, macOS, Windows) it does
    nothing and returns False. Safe to call more than once.
    """
    global _tuned
    if _tuned:
        return True
    name = ctypes.util.find_library("c")
    if os.name != "posix" or name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD_MAX) == 1
    ok = ok and mallopt(_M_TRIM_THRESHOLD, 1 << 30) == 1
    _tuned = ok
    return ok


def configure_cpu(threads: int | None = None) -> None:
    """Set intra-op threads (default: all cores) and tune the allocator."""
    if threads:
        torch.set_num_threads(threads)
    tune_cpu_allocator()
