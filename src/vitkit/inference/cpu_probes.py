"""What this CPU does fast, as the precision choices ask it: whether it computes bf16 matmuls
in hardware (`fast_bf16_cpu`: AMX or AVX512-BF16, by its flags), how much faster a bf16
matmul at a model's width measures than fp32 (`measured_bf16_speedup`: a CPU may show
AVX512-BF16 and still run bf16 slower than fp32, so that flag alone is not trusted), and the
key its measurements are remembered under (`cpu_key`)."""

from __future__ import annotations

import hashlib
import time

import torch

from vitkit.inference.autotune import PATHS_VERSION, remember, remembered
from vitkit.runtime import cpu_model_and_flags

__all__ = ["EMULATED_BF16", "bf16_matmul_note", "cpu_key", "fast_bf16_cpu",
           "measured_bf16_speedup", "slow_bf16"]

MATMUL_FLOPS = 2**30  # about the work of `_bf16_matmul_speedup`'s matmul
MAX_MATMUL_ROWS = 65536  # its rows at most (a width-16 model would take 524k)
MATMUL_ROUNDS = 5  # its alternating rounds (fp32, bf16), best of each
EMULATED_BF16 = ("this CPU has no bf16 matmuls in hardware (AMX or AVX512-BF16), so bf16 is "
                 "emulated and likely slower than fp32")


def fast_bf16_cpu(flags: frozenset[str] | None = None) -> str | None:
    """"amx" or "avx512_bf16" when this CPU computes bf16 matmuls in hardware, else None."""
    flags = cpu_model_and_flags()[1] if flags is None else flags
    if "amx_bf16" in flags:
        return "amx"
    if "avx512_bf16" in flags:
        return "avx512_bf16"
    return None


def _bf16_matmul_speedup(width: int) -> float:
    """How many times faster a (rows x width) @ (width x 4 width) matmul runs in bf16 than in
    fp32 on this CPU, rows chosen for about a GFLOP (1,024 to `MAX_MATMUL_ROWS`), so a narrow
    model's measurement is not a fraction of a millisecond that a busy moment decides."""
    rows = min(MAX_MATMUL_ROWS, max(1024, MATMUL_FLOPS // (8 * width * width)))
    generator = torch.Generator().manual_seed(0)  # not the global one: a resumed run's
    a = torch.randn(rows, width, generator=generator)  # random state stays as restored
    b = torch.randn(width, 4 * width, generator=generator)
    a16, b16 = a.bfloat16(), b.bfloat16()
    runs = {"fp32": lambda: a @ b, "bf16": lambda: a16 @ b16}
    times: dict[str, list[float]] = {name: [] for name in runs}
    for run in runs.values():
        run()  # warm-up: kernels chosen, memory allocated
    for _ in range(MATMUL_ROUNDS):  # in turns, so a busy moment hits both
        for name, run in runs.items():
            start = time.perf_counter()
            run()
            times[name].append(time.perf_counter() - start)
    return min(times["fp32"]) / min(times["bf16"])


def measured_bf16_speedup(width: int) -> float:
    """`_bf16_matmul_speedup(width)`, remembered per CPU, torch build, thread count and width
    (`vitkit.inference.autotune`), so the runs on one machine, and every resume of them,
    decide alike."""
    key = "|".join([f"v{PATHS_VERSION}:bf16-matmul", cpu_key(), torch.__version__,
                    str(torch.get_num_threads()), str(width)])
    known = remembered().get(key)
    if isinstance(known, dict) and isinstance(known.get("speedup"), float):
        return known["speedup"]
    speedup = _bf16_matmul_speedup(width)
    remember(key, {"speedup": speedup})
    return speedup


def cpu_key() -> str:
    """The CPU's model name and a digest of its flags: virtual machines of different
    generations may share a masked name ("Intel(R) Xeon(R) Processor")."""
    name, flags = cpu_model_and_flags()
    digest = hashlib.sha256(" ".join(sorted(flags)).encode()).hexdigest()[:12]
    return f"{name} (flags {digest})"


def slow_bf16(device: torch.device, width: int, flags: frozenset[str] | None = None
              ) -> str | None:
    """Why bf16 is likely slower than fp32 on this CPU for a model `width` wide (emulated, or
    an AVX512-BF16 matmul measured slower), or None (CUDA, AMX, or a bf16 matmul as fast)."""
    if device.type != "cpu":
        return None
    kind = fast_bf16_cpu(flags)
    if kind is None:
        return EMULATED_BF16
    if kind == "avx512_bf16" and (speedup := measured_bf16_speedup(width)) < 1:
        return f"{bf16_matmul_note(width, speedup)}, so bf16 is likely slower"
    return None


def bf16_matmul_note(width: int, speedup: float) -> str:
    """What a bf16 matmul measured (`speedup`) on this AVX512-BF16 CPU without AMX."""
    return (f"a bf16 matmul at width {width} measured {speedup:.2f}x fp32 on this CPU "
            "(AVX512-BF16 without AMX)")
