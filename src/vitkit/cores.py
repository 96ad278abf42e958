"""How many CPU cores are free for this process, and the thread count that holds up when
other processes use some of them.

torch runs its CPU ops on one OpenMP thread per core, and OpenMP threads wait for each other
at the end of every parallel region. When another process keeps one of the cores busy, the
thread sharing that core runs a fraction of the time and every region waits for it: a small
ViT's training step gets several times slower than on one thread (see docs/speed.md,
"Threads on a shared machine"). So vitkit counts the cores other processes use, from the
kernel's per-core counters in /proc/stat (minus this process's own CPU time and its worker
processes'), and runs on the cores that are free. `threads=N` (or OMP_NUM_THREADS) still
decides when given.

Where /proc/stat cannot be read (not Linux), nothing is measured and torch's own count stays.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from vitkit.runtime import set_threads

__all__ = [
    "CoreUse",
    "ThreadChoice",
    "ThreadWatch",
    "choose_threads",
    "core_use",
    "cores_available",
]

log = logging.getLogger("vitkit")

PROBE_SECONDS = 0.25  # how long a start-up measurement watches the counters
BUSY_CORE = 0.4  # a core counts as taken when other processes use this much of it or more


def cores_available() -> int:
    """The cores this process may run on (its CPU affinity; all cores elsewhere)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def _allowed_cpus() -> set[int] | None:
    try:
        return set(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return None


def _cpu_ticks() -> tuple[int, int] | None:
    """(busy, total) clock ticks summed over the cores this process may run on, from
    /proc/stat (None where it cannot be read)."""
    allowed = _allowed_cpus()
    busy = total = 0
    try:
        with open("/proc/stat") as stat:
            for line in stat:
                name, *fields = line.split()
                if not name.startswith("cpu") or name == "cpu":
                    continue
                if allowed is not None and int(name[3:]) not in allowed:
                    continue
                ticks = [int(value) for value in fields[:8]]
                idle = ticks[3] + ticks[4]  # idle and iowait
                busy += sum(ticks) - idle
                total += sum(ticks)
    except (OSError, ValueError, IndexError):
        return None
    return (busy, total) if total else None


def _own_ticks() -> int:
    """CPU clock ticks used by this process and its direct child processes (DataLoader
    workers), from /proc; 0 where it cannot be read."""
    me = os.getpid()
    used = 0
    try:
        entries = os.listdir("/proc")
    except OSError:
        return 0
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        fields = text[text.rfind(")") + 2:].split()  # after "pid (comm) "
        if int(entry) == me or (len(fields) > 1 and fields[1] == str(me)):
            used += int(fields[11]) + int(fields[12])  # utime + stime
    return used


@dataclass(frozen=True)
class CoreUse:
    """Over a span of time: the cores this process may use (`cores`) and how many of them
    other processes kept busy (`elsewhere`, in cores: 1.0 is one core all the time)."""

    cores: int
    elsewhere: float

    @property
    def taken(self) -> int:
        """Cores other processes hold, counting one used `BUSY_CORE` or more."""
        return min(self.cores, int(self.elsewhere + 1 - BUSY_CORE))

    @property
    def free(self) -> int:
        return max(1, self.cores - self.taken)


class _Counters:
    """A reading of the counters `core_use` compares across a span."""

    def __init__(self) -> None:
        self.ticks = _cpu_ticks()
        self.own = _own_ticks()

    def since(self, earlier: _Counters, cores: int) -> CoreUse | None:
        if self.ticks is None or earlier.ticks is None:
            return None
        total = self.ticks[1] - earlier.ticks[1]
        if total <= 0:
            return None
        busy = self.ticks[0] - earlier.ticks[0] - (self.own - earlier.own)
        return CoreUse(cores, max(0.0, cores * busy / total))


def core_use(seconds: float = PROBE_SECONDS) -> CoreUse | None:
    """How busy other processes keep this process's cores over the next `seconds` (None
    where the counters cannot be read)."""
    cores = cores_available()
    start = _Counters()
    time.sleep(seconds)
    return _Counters().since(start, cores)


@dataclass(frozen=True)
class ThreadChoice:
    """The intra-op thread count chosen; `reason` says why when it is fewer than `ceiling`
    (torch's default). `pinned`: the count was asked for (threads=N, OMP_NUM_THREADS), so
    nothing moves it later."""

    threads: int
    ceiling: int
    pinned: bool = False
    reason: str = ""

    def watch(self) -> ThreadWatch | None:
        """A `ThreadWatch` that follows other processes during a long run (None when pinned
        or when there is a single thread to begin with)."""
        return None if self.pinned or self.ceiling <= 1 else ThreadWatch(self.ceiling)


def _busy_words(use: CoreUse) -> str:
    return (f"other processes are using {use.taken} of the {use.cores} cores "
            f"({use.elsewhere:.1f} cores busy)")


def _threads(count: int) -> str:
    return f"{count} thread{'s' if count != 1 else ''}"


def choose_threads(requested: int | None = None, *, measure: Callable[[], CoreUse | None]
                   = core_use, what: str = "running", pin: str = "OMP_NUM_THREADS={n}"
                   ) -> ThreadChoice:
    """Set torch's intra-op threads: `requested` when given (OMP_NUM_THREADS counts as asked
    for), else one per core that other processes leave free, at most torch's default,
    measured now. Logs one line when it runs on fewer threads than that default, with `pin`
    (its "{n}" the default count) as the way to ask for them anyway."""
    default = torch.get_num_threads()
    if requested:
        set_threads(requested)
        return ThreadChoice(requested, default, pinned=True)
    if os.environ.get("OMP_NUM_THREADS"):
        return ThreadChoice(default, default, pinned=True)
    if default <= 1:
        return ThreadChoice(default, default)
    use = measure()
    if use is None or use.free >= default:
        return ThreadChoice(default, default)
    threads = use.free
    set_threads(threads)
    reason = (f"{_busy_words(use)}: {what} on {_threads(threads)}, faster than "
              f"{default} on shared cores ({pin.format(n=default)} asks for them anyway)")
    log.info("%s", reason)
    return ThreadChoice(threads, default, reason=reason)


class ThreadWatch:
    """Re-checks, between training steps, whether other processes took or left cores, and
    moves the thread count with them (never above `ceiling`, torch's default). `check()` is
    cheap: it compares the counters since the previous check, at most every `every` seconds."""

    def __init__(self, ceiling: int, every: float = 20.0) -> None:
        self.ceiling, self.every = ceiling, every
        self._last = _Counters()
        self._at = time.monotonic()

    def check(self) -> str | None:
        """The line to log when the thread count changed, else None."""
        now = time.monotonic()
        if now - self._at < self.every:
            return None
        counters = _Counters()
        use = counters.since(self._last, cores_available())
        self._last, self._at = counters, now
        if use is None:
            return None
        threads = min(self.ceiling, use.free)
        current = torch.get_num_threads()
        if threads == current:
            return None
        set_threads(threads)
        if threads < current:
            return f"{_busy_words(use)}: training on {_threads(threads)} from here"
        return f"other processes left cores free: training on {_threads(threads)} from here"
