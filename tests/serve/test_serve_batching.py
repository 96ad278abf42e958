"""Dynamic batching: batches are bounded by max_batch and max_wait_ms, a failing batch fails only
the request that causes it, and concurrent requests through the app give the same predictions
with batching on as with it off."""

from __future__ import annotations

import asyncio
import threading
import time

import httpx
import numpy as np
import pytest

from serve_models import png_bytes, save_classifier
from vitkit.errors import ConfigError
from vitkit.serve.app import create_app
from vitkit.serve.batching import DynamicBatcher
from vitkit.serve.service import ModelService


class Recorder:
    """A work function that doubles numbers, records its batch sizes and threads, and fails
    on a negative input."""

    def __init__(self, delay: float = 0.0) -> None:
        self.sizes: list[int] = []
        self.threads: set[int] = set()
        self.delay = delay

    def __call__(self, inputs: list[int]) -> list[int]:
        self.sizes.append(len(inputs))
        self.threads.add(threading.get_ident())
        if any(x < 0 for x in inputs):
            raise ValueError("negative input")
        time.sleep(self.delay)
        return [2 * x for x in inputs]


def test_concurrent_requests_are_batched_up_to_max_batch():
    work = Recorder(delay=0.01)

    async def main():
        batcher = DynamicBatcher(work, max_batch=4, max_wait_ms=200)
        results = await asyncio.gather(*(batcher.submit([i]) for i in range(10)))
        await batcher.close()
        return results, batcher.stats

    results, stats = asyncio.run(main())
    assert results == [[2 * i] for i in range(10)]
    assert work.sizes == [4, 4, 2] and stats.largest == 4 and stats.inputs == 10
    assert len(work.threads) == 1 and threading.get_ident() not in work.threads


def test_max_wait_ms_bounds_the_wait_of_a_lone_request():
    work = Recorder()

    async def main():
        batcher = DynamicBatcher(work, max_batch=64, max_wait_ms=50)
        start = time.perf_counter()
        result = await batcher.submit([1, 2])
        waited = time.perf_counter() - start
        await batcher.close()
        return result, waited

    result, waited = asyncio.run(main())
    assert result == [2, 4] and work.sizes == [2]
    assert 0.045 <= waited < 1.0


def test_a_request_larger_than_max_batch_runs_alone_and_max_batch_1_never_batches():
    work = Recorder()

    async def main():
        big = DynamicBatcher(work, max_batch=2, max_wait_ms=20)
        results = await asyncio.gather(big.submit([1, 2, 3]), big.submit([4]))
        off = DynamicBatcher(work, max_batch=1, max_wait_ms=20)
        singles = await asyncio.gather(*(off.submit([i]) for i in range(3)))
        await big.close()
        await off.close()
        return results, singles

    results, singles = asyncio.run(main())
    assert results == [[2, 4, 6], [8]] and singles == [[0], [2], [4]]
    assert work.sizes == [3, 1, 1, 1, 1]


def test_a_failing_batch_fails_only_the_request_that_causes_it():
    work = Recorder()

    async def main():
        batcher = DynamicBatcher(work, max_batch=8, max_wait_ms=100)
        results = await asyncio.gather(batcher.submit([1]), batcher.submit([-1]),
                                       batcher.submit([3]), return_exceptions=True)
        after = await batcher.submit([5])
        await batcher.close()
        return results, after

    results, after = asyncio.run(main())
    assert results[0] == [2] and results[2] == [6] and after == [10]
    assert isinstance(results[1], ValueError)


def test_bad_settings_are_refused():
    for setting, parts in (({"max_batch": 0}, ("max_batch", ">= 1", "got 0")),
                           ({"max_wait_ms": -1}, ("max_wait_ms", ">= 0", "got -1"))):
        with pytest.raises(ConfigError) as info:
            DynamicBatcher(Recorder(), **setting)
        for part in parts:
            assert part in str(info.value), str(info.value)


async def _predict_concurrently(app, images: list[bytes]) -> list[dict]:
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://serve") as client:
        async def one(index: int, data: bytes) -> dict:
            response = await client.post("/api/predict", data={"topk": "3"},
                                         files={"file": (f"{index}.png", data)})
            assert response.status_code == 200, response.text
            return response.json()["predictions"][0]

        return await asyncio.gather(*(one(i, data) for i, data in enumerate(images)))


def test_batched_predictions_equal_one_at_a_time(tmp_path):
    service = ModelService.load(save_classifier(tmp_path / "model"))
    images = [png_bytes(seed, (16 + seed % 5, 16 + seed % 3)) for seed in range(24)]
    batched_app = create_app(service, max_batch=8, max_wait_ms=50)
    batched = asyncio.run(_predict_concurrently(batched_app, images))
    single_app = create_app(service, max_batch=1)
    single = asyncio.run(_predict_concurrently(single_app, images))
    assert batched_app.state.batcher.stats.largest > 1  # batching happened
    assert single_app.state.batcher.stats.largest == 1
    assert [row["path"] for row in batched] == [f"{i}.png" for i in range(24)]
    for got, want in zip(batched, single, strict=True):
        assert got["path"] == want["path"]
        assert [t["index"] for t in got["topk"]] == [t["index"] for t in want["topk"]]
        np.testing.assert_allclose([t["prob"] for t in got["topk"]],
                                   [t["prob"] for t in want["topk"]], atol=1e-5)

