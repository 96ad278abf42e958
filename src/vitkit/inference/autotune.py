"""Timing alternatives against each other, and remembering what was measured.

`best_times` times ways of doing the same work in turns, so that a busy moment on a shared
machine hits every one of them, and gives each one's best time. Its measurements are worth
keeping: `remembered` and `remember` hold them in `<cache root>/precision.json`
(`vitkit.files.cache_root`), keyed by their caller (machine, torch build, model shape, batch),
so only the first run on a machine pays for a measurement and every later one decides alike.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections.abc import Callable
from pathlib import Path

import torch

from vitkit.files import cache_root, write_atomic

__all__ = ["CLOSE", "MAX_ROUNDS", "PATHS_VERSION", "ROUNDS", "WARMUP_CALLS", "best_times",
           "remember", "remembered", "store"]

WARMUP_CALLS = 1  # untimed calls of each path before the rounds
ROUNDS = 3
MAX_ROUNDS = 7  # the rounds while the two fastest paths are within CLOSE of each other
CLOSE = 1.25
PATHS_VERSION = 2  # in remembered keys; raised when what a path runs changes (2: bf16 prepacked)


@torch.no_grad()
def best_times(runners: dict[str, Callable[[], object]]) -> dict[str, float]:
    """The best seconds of each runner over `ROUNDS` rounds, timed in turns so a busy moment
    hits all; more rounds, up to `MAX_ROUNDS`, while the two fastest paths other than fp32
    are within `CLOSE` of each other (a few rounds can order two close paths wrongly). In
    inference mode, as the verbs run: autograd's recording slows some paths more than others."""
    times: dict[str, list[float]] = {name: [] for name in runners}
    with torch.inference_mode():
        for run in runners.values():
            for _ in range(WARMUP_CALLS):
                run()  # warm-up: kernels chosen, memory allocated
        rounds = 0
        while rounds < ROUNDS or (rounds < MAX_ROUNDS and _undecided(times)):
            for name, run in runners.items():
                start = time.perf_counter()
                run()
                times[name].append(time.perf_counter() - start)
            rounds += 1
    return {name: min(values) for name, values in times.items()}


def _undecided(times: dict[str, list[float]]) -> bool:
    """Whether the two fastest paths (fp32 aside) are within `CLOSE` of each other."""
    best = sorted(min(values) for name, values in times.items() if name != "fp32")
    return len(best) > 1 and best[1] < CLOSE * best[0]


def store() -> Path:
    """The file the measurements are remembered in."""
    return cache_root() / "precision.json"


def remembered() -> dict[str, dict]:
    """Every remembered measurement by its key ({} where none can be read)."""
    try:
        data = json.loads(store().read_text())
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def remember(key: str, entry: dict) -> None:
    """Keep `entry` under `key` (nothing where the cache is read-only: measured again)."""
    data = remembered()
    data[key] = entry
    text = json.dumps(data, indent=1).encode()
    with contextlib.suppress(OSError):  # a read-only cache: measure again next time
        write_atomic(store(), lambda stream: stream.write(text))
