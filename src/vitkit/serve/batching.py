"""Dynamic batching: concurrent requests run through the model together.

A request's inputs are queued; one collector task takes the first queued request and keeps
taking more until the batch holds `max_batch` inputs or `max_wait_ms` have passed since that
first request was queued, whichever comes first, then runs the whole batch in one call of the
work function and hands each request its own outputs. The work runs in a single worker thread
(torch releases the GIL while it computes), so the event loop never blocks and the model is
never run by two threads at once; `run_alone` puts other model work (explain, figures) in
the same thread. While a batch runs, new requests queue for the next one.

A request with more inputs than `max_batch` runs alone, in one call. A batch whose call fails
is retried request by request, so a failure reaches only the requests that cause it.
`max_batch` 1 turns batching off: each request runs alone, in arrival order.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from vitkit.errors import ConfigError

__all__ = ["BatchStats", "DynamicBatcher"]

In = TypeVar("In")
Out = TypeVar("Out")


@dataclass
class _Job(Generic[In]):
    inputs: Sequence[In]
    future: asyncio.Future
    queued: float  # time.monotonic() when queued


@dataclass
class BatchStats:
    """What the batcher has done: batches run, inputs through them, the largest batch."""

    batches: int = 0
    inputs: int = 0
    largest: int = 0
    sizes: list[int] = field(default_factory=list)  # the last 1000 batch sizes

    def add(self, size: int) -> None:
        self.batches += 1
        self.inputs += size
        self.largest = max(self.largest, size)
        self.sizes = [*self.sizes[-999:], size]


class DynamicBatcher(Generic[In, Out]):
    """Batches `submit` calls into calls of `work(inputs) -> outputs` (one output per input,
    in order), run in one worker thread. Start on first use; `close` finishes the queue."""

    def __init__(self, work: Callable[[list[In]], Sequence[Out]], max_batch: int = 8,
                 max_wait_ms: float = 5.0) -> None:
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        if not (math.isfinite(max_wait_ms) and max_wait_ms >= 0):
            raise ConfigError(f"max_wait_ms must be a finite number >= 0, got {max_wait_ms}")
        self.work, self.max_batch, self.max_wait = work, max_batch, max_wait_ms / 1000
        self.stats = BatchStats()
        self.executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="vitkit-model")
        self._queue: asyncio.Queue[_Job[In] | None] | None = None
        self._collector: asyncio.Task | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiting: _Job[In] | None = None  # taken from the queue, for the next batch

    def _start(self) -> asyncio.Queue:
        """The queue, with its collector started on this event loop (again, on a new loop:
        a test client may run each request on its own)."""
        loop = asyncio.get_running_loop()
        if self._queue is None or self._loop is not loop:
            self._queue, self._loop, self._waiting = asyncio.Queue(), loop, None
            self._collector = loop.create_task(self._collect(self._queue))
        return self._queue

    async def submit(self, inputs: Sequence[In]) -> list[Out]:
        """The outputs of `work` for `inputs`, computed in a batch with other requests."""
        if not inputs:
            return []
        future = asyncio.get_running_loop().create_future()
        self._start().put_nowait(_Job(list(inputs), future, time.monotonic()))
        return await future

    async def run_alone(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` in the model's worker thread (between batches)."""
        return await asyncio.get_running_loop().run_in_executor(self.executor, function, *args)

    async def _next_batch(self, queue: asyncio.Queue) -> list[_Job[In]] | None:
        """The jobs of the next batch (None: closed): the first job, then more until
        `max_batch` inputs or the first job's deadline."""
        first = self._waiting or await queue.get()
        self._waiting = None
        if first is None:
            return None
        jobs, count = [first], len(first.inputs)
        deadline = first.queued + self.max_wait
        while count < self.max_batch:
            try:
                if queue.empty():
                    left = deadline - time.monotonic()
                    if left <= 0:
                        break
                    job = await asyncio.wait_for(queue.get(), left)
                else:
                    job = queue.get_nowait()
            except TimeoutError:
                break
            if job is None or count + len(job.inputs) > self.max_batch:
                self._waiting = job  # the next batch starts with it (or closes)
                break
            jobs.append(job)
            count += len(job.inputs)
        return jobs

    async def _collect(self, queue: asyncio.Queue) -> None:
        while True:
            jobs = await self._next_batch(queue)
            if jobs is None:
                return
            await self._run(jobs)

    async def _run(self, jobs: list[_Job[In]]) -> None:
        inputs = [item for job in jobs for item in job.inputs]
        try:
            outputs = await self.run_alone(self.work, inputs)
            if len(outputs) != len(inputs):
                raise RuntimeError(f"the work function gave {len(outputs)} outputs for "
                                   f"{len(inputs)} inputs")
        except Exception as exc:
            if len(jobs) > 1:  # find the request that fails: the others still get answers
                for job in jobs:
                    await self._run([job])
                return
            _settle(jobs[0].future, exception=exc)
            return
        self.stats.add(len(inputs))
        start = 0
        for job in jobs:
            _settle(job.future, list(outputs[start:start + len(job.inputs)]))
            start += len(job.inputs)

    async def close(self) -> None:
        """Finish every queued request, then stop the collector (the worker thread stays for
        a later start)."""
        if self._queue is not None and self._loop is asyncio.get_running_loop():
            self._queue.put_nowait(None)
            await self._collector
        self._queue = self._collector = self._loop = None


def _settle(future: asyncio.Future, result: Any = None,
            exception: BaseException | None = None) -> None:
    if future.done():  # the client went away and its request was cancelled
        return
    if exception is not None:
        future.set_exception(exception)
    else:
        future.set_result(result)
