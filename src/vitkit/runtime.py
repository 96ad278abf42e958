"""Process settings: which device to run on, and what makes CPU training faster.

`check_device` refuses a device name that torch does not know or this machine does not
have, before any data is loaded.

glibc returns large freed blocks to the operating system at once, so every training step
allocates its activations on fresh pages and pays a page fault for each of them, a sizeable
share of a small ViT's step spent in system time. Keeping freed memory in the process removes
that cost; peak memory is unchanged, it is simply not given back between steps.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import importlib.util
import os
import shutil
import sys

import torch

from vitkit.errors import ConfigError

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


def set_threads(threads: int | None) -> None:
    """Run torch ops on `threads` intra-op threads; a no-op for None or the current count.

    Calling `torch.set_num_threads` is not neutral even with the count it already has: it also
    turns MKL's dynamic threading off, for good (PyTorch re-applies it as each thread joins a
    parallel region). Then the small GEMMs that SDPA's CPU flash-attention kernel runs inside
    its OpenMP threads get slower, attention forward and backward at the tutorial's shapes
    among them (`benchmarks/step_one_process.py --set-threads` measures it)."""
    if threads and threads != torch.get_num_threads():
        torch.set_num_threads(threads)


def configure_cpu(threads: int | None = None) -> None:
    """Set intra-op threads (default: all cores; `set_threads`) and tune the allocator."""
    set_threads(threads)
    tune_cpu_allocator()


def avoid_cudnn_attention(device: torch.device) -> bool:
    """For training on CUDA: turn off SDPA's cuDNN backend (flash and memory-efficient
    attention stay). Returns whether this call turned it off. cuDNN's bf16 attention backward,
    SDPA's default backend on H100/H200 since torch 2.11, gives NaN gradients while the losses
    stay finite (pytorch/pytorch#196678, huggingface/trl#7181), at the 64 tokens of vitkit's
    CIFAR-10 recipes too; fp32 and the other backends train clean (docs/recipes/cifar10.md)."""
    if device.type != "cuda" or not torch.backends.cuda.cudnn_sdp_enabled():
        return False
    torch.backends.cuda.enable_cudnn_sdp(False)
    return True


def check_device(name: str) -> None:
    """Refuse a `device=` setting this machine cannot run: unknown names ("gpu"), CUDA
    without a GPU, a GPU index past the last one, MPS off Apple silicon."""
    choices = "use device=auto (a GPU when there is one, else the CPU), cpu, cuda, cuda:N or mps"
    if name == "auto":
        return
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise ConfigError(f"device={name!r} is not a device name: {choices}") from None
    if device.type == "cuda":
        if not torch.cuda.is_available():
            build = "a CPU-only build" if torch.version.cuda is None else \
                f"built for CUDA {torch.version.cuda}, but no GPU or driver was found"
            raise ConfigError(f"device={name!r} but this machine has no usable CUDA GPU (torch "
                              f"{torch.__version__}: {build}); use device=cpu or device=auto")
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            raise ConfigError(f"device={name!r} but this machine has {count} GPU(s), "
                              f"cuda:0 to cuda:{count - 1}; use one of those or device=cuda")
    elif device.type == "mps":
        if not torch.backends.mps.is_available():
            raise ConfigError(f"device={name!r} but MPS (Apple silicon GPUs) is not available "
                              "here; use device=cpu or device=auto")
    elif device.type != "cpu":
        raise ConfigError(f"device={name!r} is not supported for training: {choices}")


# The instruction sets that decide CPU speed for ViTs: fp32 (AVX2, AVX-512), fast bf16 (AVX-512
# BF16, AMX) and int8 (VNNI), as /proc/cpuinfo names them.
SPEED_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "avx_vnni", "amx_tile",
               "amx_bf16", "amx_int8")


C_COMPILERS = ("cc", "gcc", "clang", "c++", "g++", "clang++")


def check_compiler(device: torch.device, option: str, without: str) -> None:
    """Refuse `option` (torch.compile) clearly where inductor cannot build CPU kernels: no
    C/C++ compiler on the PATH; `without` is the fix that needs none."""
    if device.type == "cpu" and not any(shutil.which(name) for name in C_COMPILERS):
        raise ConfigError(f"{option} on the CPU needs a C++ compiler (gcc or clang) on the "
                          "PATH for torch.compile's kernels: install one (e.g. apt-get install "
                          f"g++) or {without}")


def installed(module: str) -> bool:
    """Whether the Python package `module` can be imported (False too where sys.modules blocks
    it with None), without importing it."""
    try:
        return sys.modules.get(module, True) is not None and \
            importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def cpu_model_and_flags() -> tuple[str, frozenset[str]]:
    """This CPU's model name and instruction-set flags as /proc/cpuinfo names them (no flags
    where it cannot be read: not Linux)."""
    model, flags = "", frozenset()
    try:
        with open("/proc/cpuinfo") as info:
            for line in info:
                key, _, value = line.partition(":")
                if key.strip() == "model name" and not model:
                    model = value.strip()
                elif key.strip() == "flags" and not flags:
                    flags = frozenset(value.split())
    except OSError:  # not Linux
        import platform

        model = platform.processor() or platform.machine()
    return model, flags


def cpu_description() -> str:
    """One line naming this machine's CPU, its cores and the speed-relevant instruction sets,
    and the torch build, e.g. "AMD EPYC (2 cores; avx2) · torch 2.14.1, 2 threads". Every
    benchmark prints it, so figures are compared only between runs on the same kind of CPU."""
    model, flags = cpu_model_and_flags()
    present = [flag for flag in SPEED_FLAGS if flag in flags] or [
        "none of avx2/avx512f" if flags else "instruction sets not read"]
    return (f"{model or 'unknown CPU'} ({os.cpu_count()} cores; {' '.join(present)}) · "
            f"torch {torch.__version__}, {torch.get_num_threads()} threads")
