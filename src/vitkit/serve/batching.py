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

At most `max_queue` requests wait for the model at once (queued, in the running batch, or in
`run_alone`); one more raises `QueueFull` at once, so a flood of requests is refused instead
of held in memory for a wait nobody would sit through. A request whose caller went away
before its batch ran is left out of the batch.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from vitkit.errors import ConfigError

__all__ = ["BatchStats", "DynamicBatcher", "QueueFull", "default_max_queue"]

In = TypeVar("In")
Out = TypeVar("Out")


def default_max_queue(max_batch: int) -> int:
    """How many requests may wait for the model: eight batches' worth, at least 64."""
    return max(64, 8 * max_batch)


class QueueFull(Exception):
    """`max_queue` requests already wait for the model (the server answers 503)."""

    def __init__(self, max_queue: int) -> None:
        super().__init__(f"{max_queue} requests already wait for the model, the limit "
                         "(--max-queue)")
        self.max_queue = max_queue


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
    in order), run in one worker thread, at most `max_queue` requests waiting (default:
    `default_max_queue`). Start on first use; `close` finishes the queue."""

    def __init__(self, work: Callable[[list[In]], Sequence[Out]], max_batch: int = 8,
                 max_wait_ms: float = 5.0, max_queue: int | None = None) -> None:
        if max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {max_batch}")
        max_queue = default_max_queue(max_batch) if max_queue is None else max_queue
        if max_queue < 1:
            raise ConfigError(f"max_queue must be >= 1, got {max_queue}")
        self.max_queue, self.waiting = max_queue, 0  # requests waiting for the model now
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
        with self._admitted():
            future = asyncio.get_running_loop().create_future()
            self._start().put_nowait(_Job(list(inputs), future, time.monotonic()))
            return await future

    async def run_alone(self, function: Callable[..., Any], *args: Any) -> Any:
        """`function(*args)` in the model's worker thread (between batches), counted in
        `max_queue` like a request."""
        with self._admitted():
            return await self._in_worker(function, *args)

    @contextlib.contextmanager
    def _admitted(self) -> Iterator[None]:
        """Count a request as waiting for the model, or raise QueueFull when the limit is
        reached."""
        if self.waiting >= self.max_queue:
            raise QueueFull(self.max_queue)
        self.waiting += 1
        try:
            yield
        finally:
            self.waiting -= 1

    async def _in_worker(self, function: Callable[..., Any], *args: Any) -> Any:
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
        jobs = [job for job in jobs if not job.future.done()]  # callers still waiting
        if not jobs:
            return
        inputs = [item for job in jobs for item in job.inputs]
        try:
            outputs = await self._in_worker(self.work, inputs)
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
