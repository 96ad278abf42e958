"""`vitkit serve` against files that are small on the wire but huge decoded: a 10 kB PNG of
9400x9400 1-bit pixels is refused (413) from its header, before any pixel is decoded, naming
the limit, its size and --max-pixels, and raising --max-pixels lets such an image through; a
request's images are capped together (--max-batch x --max-pixels), array files by the values
their .npy headers declare; at most two images of the largest allowed size decode at once; a
real server's memory returns to its level after a burst of large images; malformed multipart
bodies say what is wrong with them."""

from __future__ import annotations

import asyncio
import io
import resource
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from PIL import Image

from messages import says
from serve_models import npy_bytes, png_bytes, save_classifier
from serve_process import rss_mb, start_server
from vitkit.data import array_inputs, image_decoder
from vitkit.errors import ConfigError
from vitkit.serve.app import create_app
from vitkit.serve.service import ModelService
from vitkit.serve.uploads import DecodeBudget, default_max_pixels

FLOOR = 4096 * 4096  # the default per-image limit of a small model: 16,777,216 pixels


def _bilevel_png(width: int, height: int) -> bytes:
    """A 1-bit PNG: a few kB on disk whatever its size (9400x9400: ~10 kB, 88 M pixels)."""
    buffer = io.BytesIO()
    Image.new("1", (width, height)).save(buffer, "PNG")
    return buffer.getvalue()


BOMB = _bilevel_png(9400, 9400)  # just under Pillow's limit, so Pillow alone lets it through


@pytest.fixture(scope="module")
def client(classifier):
    with TestClient(create_app(ModelService.load(classifier))) as test_client:
        yield test_client


def _post(client, files, route="/api/predict"):
    return client.post(route, files=[("file", item) for item in files])


def _peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_the_default_limit_is_16x_the_input_and_at_least_4096_squared():
    assert default_max_pixels((16, 16)) == FLOOR
    assert default_max_pixels((224, 224)) == FLOOR
    assert default_max_pixels((384, 384)) == FLOOR
    assert default_max_pixels((2048, 2048)) == 16 * 2048 * 2048


def test_the_model_route_lists_the_pixel_limits(client):
    described = client.get("/api/model").json()
    assert described["max_pixels"] == FLOOR
    assert described["max_request_pixels"] == 8 * FLOOR  # --max-batch 8 images


def test_a_small_png_that_decodes_huge_is_refused_from_its_header(client, monkeypatch):
    assert len(BOMB) < 30_000 and Image.MAX_IMAGE_PIXELS > 9400 * 9400
    decoded = []
    real = image_decoder.decode_image
    monkeypatch.setattr(image_decoder, "decode_image",
                        lambda *args, **kw: decoded.append(1) or real(*args, **kw))
    peak, start = _peak_rss_mb(), time.monotonic()
    response = _post(client, [("bomb.png", BOMB)])
    took = time.monotonic() - start
    assert response.status_code == 413, response.text
    says(response.json()["error"], "bomb.png", "9400x9400", "88,360,000 pixels",
         "limit of 16,777,216 pixels per image", "before decoding", "--max-pixels")
    assert decoded == []  # never handed to the decoder
    assert took < 1.0, f"{took:.2f} s: was it decoded?"  # decoding it takes seconds
    assert _peak_rss_mb() - peak < 100  # decoding it takes ~450 MB
    assert _post(client, [("ok.png", png_bytes(1))]).status_code == 200


def test_ordinary_images_still_answer(client):
    photo = png_bytes(5, (480, 640))
    response = _post(client, [("photo.png", photo), ("small.png", png_bytes(6))])
    assert response.status_code == 200, response.text
    assert [row["path"] for row in response.json()["predictions"]] == ["photo.png", "small.png"]


def test_a_multi_frame_file_counts_its_first_frame_the_one_decoded(classifier):
    buffer = io.BytesIO()
    frames = [Image.new("L", (100, 100), shade) for shade in (0, 128, 255)]
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:])
    with TestClient(create_app(ModelService.load(classifier), max_pixels=10_000)) as client:
        assert _post(client, [("moving.gif", buffer.getvalue())]).status_code == 200


def test_raising_max_pixels_as_advised_lets_the_image_through(classifier):
    big = _bilevel_png(5000, 5000)  # 25 M pixels: over the default 16.8 M
    service = ModelService.load(classifier)
    with TestClient(create_app(service)) as client:
        refused = _post(client, [("big.png", big)])
        assert refused.status_code == 413
        says(refused.json()["error"], "5000x5000", "--max-pixels")
    with TestClient(create_app(service, max_pixels=25_000_000)) as client:
        answered = _post(client, [("big.png", big)])
        assert answered.status_code == 200, answered.text
        assert answered.json()["predictions"][0]["path"] == "big.png"


def test_explain_keeps_the_same_limit(client):
    response = _post(client, [("bomb.png", BOMB)], "/api/explain")
    assert response.status_code == 413
    says(response.json()["error"], "9400x9400", "--max-pixels")


def test_a_request_of_many_medium_images_is_refused_and_fewer_pass(classifier):
    app = create_app(ModelService.load(classifier), max_pixels=10_000, max_batch=2)
    medium = [(f"m{index}.png", png_bytes(index, (90, 100))) for index in range(3)]
    with TestClient(app) as client:
        refused = _post(client, medium)  # 3 x 9,000 pixels, over 2 x 10,000
        assert refused.status_code == 413, refused.text
        says(refused.json()["error"], "m2.png", "27,000 pixels", "20,000 per request",
             "--max-batch", "--max-pixels", "fewer or smaller images")
        assert _post(client, medium[:2]).status_code == 200
        one = _post(client, [("wide.png", png_bytes(0, (101, 100)))])  # 10,100 pixels
        assert one.status_code == 413
        says(one.json()["error"], "wide.png", "100x101", "10,000 pixels per image")


def test_array_files_are_capped_by_their_header_before_they_are_read(regressor, monkeypatch):
    app = create_app(ModelService.load(regressor), max_pixels=4096, max_batch=8)
    buffer = io.BytesIO()
    np.savez_compressed(buffer, images=np.zeros((1000, 64, 64), np.float32))
    npz = buffer.getvalue()  # 16 kB, 4 M values once read: over 8 x 4,096 per request
    read = []
    real = array_inputs.read_array_images
    monkeypatch.setattr("vitkit.serve.uploads.read_array_images",
                        lambda *args, **kw: read.append(1) or real(*args, **kw))
    with TestClient(app) as client:
        refused = _post(client, [("many.npz", npz)])
        assert refused.status_code == 413, refused.text
        says(refused.json()["error"], "many.npz", "4,096,000 pixels", "32,768 per request",
             "--max-pixels")
        too_many = npy_bytes(np.zeros((9, 64, 64), np.float32))  # 36,864 values
        refused = _post(client, [("many.npy", too_many)])
        assert refused.status_code == 413
        says(refused.json()["error"], "many.npy", "36,864 pixels", "per request")
        assert read == []  # refused from the headers
        wide = _post(client, [("wide.npy", npy_bytes(np.zeros((1, 80, 80), np.float32)))])
        assert wide.status_code == 413  # 6,400 pixels in one image, over 4,096
        says(wide.json()["error"], "wide.npy[0]", "80x80 = 6,400 pixels", "per image",
             "--max-pixels")
        fits = _post(client, [("ok.npy", npy_bytes(np.zeros((8, 16, 16), np.float32)))])
        assert fits.status_code == 200 and len(fits.json()["predictions"]) == 8


def test_max_pixels_on_the_command_line_must_be_a_positive_number(classifier, capsys):
    from vitkit.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", str(classifier), "--max-pixels", "0"])
    assert exited.value.code == 2
    says(capsys.readouterr().err, "--max-pixels")


def test_max_pixels_must_be_within_pillows_limit(classifier):
    service = ModelService.load(classifier)
    for value in (0, 10**10):
        with pytest.raises(ConfigError) as info:
            create_app(service, max_pixels=value)
        says(str(info.value), "max_pixels" if value == 0 else "--max-pixels")


@pytest.mark.parametrize(("content_type", "body", "parts"), [
    ("multipart/form-data; boundary=", b"--\r\n\r\n--\r\n",
     ("empty boundary", "curl -F file=@PATH")),
    ("multipart/form-data; boundary=xyz",
     b'--xyz\r\nContent-Disposition: form-data; name="file"; filename="a.png"\r\n\r\nDATA',
     ("malformed", "ends before its closing boundary", "--xyz--", "curl -F file=@PATH")),
    ("multipart/form-data; boundary=xyz", b"",
     ("malformed", "empty", "curl -F file=@PATH")),
], ids=["empty boundary", "unterminated", "empty body"])
def test_malformed_multipart_bodies_say_what_is_wrong(client, content_type, body, parts):
    response = client.post("/api/predict", content=body, headers={"Content-Type": content_type})
    assert response.status_code == 400, response.text
    says(response.json()["error"], *parts)
    assert "no file in the request" not in response.json()["error"]


def test_the_decode_budget_lets_two_large_decodes_run_at_once_first_come_first_served():
    async def scenario() -> tuple[int, list[int]]:
        budget = DecodeBudget(2 * FLOOR)
        running, most, order = 0, 0, []

        async def decode(index: int, pixels: int) -> None:
            nonlocal running, most
            async with budget.hold(pixels):
                running += 1
                most = max(most, running)
                order.append(index)
                await asyncio.sleep(0.01)
                running -= 1

        waiter = asyncio.create_task(decode(99, FLOOR))
        await asyncio.gather(*(decode(index, FLOOR) for index in range(8)),
                             decode(8, 1000))  # a small one queues behind the large ones
        await waiter
        cancelled = asyncio.create_task(budget.hold(FLOOR).__aenter__())
        async with budget.hold(2 * FLOOR):
            await asyncio.sleep(0)
            cancelled.cancel()  # gives up while waiting: it must not keep its share
        await asyncio.sleep(0)
        assert budget.held == 0
        return most, order

    most, order = asyncio.run(scenario())
    assert most == 2
    assert order == [99, *range(9)]


# -- a real server process ---------------------------------------------------------------------

@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc for RSS")
def test_a_server_refuses_the_bomb_fast_and_returns_to_its_memory_after_a_burst(tmp_path):
    """Eight concurrent 9400x9400 1-bit PNGs are 413s that leave memory where it was; eight
    allowed 4096x4096 ones raise it while they decode (two at a time) and the server gives the
    memory back afterwards (malloc_trim), within 150 MB of where it started."""
    weights = save_classifier(tmp_path / "model")
    process, url = start_server(weights, tmp_path / "server.log", "--max-pixels", "20000000",
                                OMP_NUM_THREADS="1")
    try:
        assert httpx.get(f"{url}/api/model").json()["max_pixels"] == 20_000_000
        with httpx.Client(base_url=url, timeout=120) as warm:
            for seed in range(20):
                assert warm.post("/api/predict", files={"file": ("w.png", png_bytes(seed))}
                                 ).status_code == 200
        before = rss_mb(process.pid)
        peak, watching = [before], [True]

        def watch() -> None:
            while watching[0]:
                peak[0] = max(peak[0], rss_mb(process.pid))
                time.sleep(0.005)

        watcher = threading.Thread(target=watch)
        watcher.start()
        big = _bilevel_png(4096, 4096)  # at the limit: allowed, ~85 MB while it decodes

        def post(item: tuple[str, bytes]) -> tuple[int, float]:
            start = time.monotonic()
            response = httpx.post(f"{url}/api/predict", files={"file": item}, timeout=120)
            return response.status_code, time.monotonic() - start

        with ThreadPoolExecutor(8) as pool:
            bombs = list(pool.map(post, [(f"bomb{i}.png", BOMB) for i in range(8)]))
            bomb_peak = peak[0]
            allowed = list(pool.map(post, [(f"big{i}.png", big) for i in range(8)]))
        time.sleep(0.5)
        watching[0] = False
        watcher.join()
        after = rss_mb(process.pid)
    finally:
        process.terminate()
        process.wait(timeout=60)
    figures = (f"RSS before {before:.0f} MB, after the bombs {bomb_peak:.0f} MB, peak "
               f"{peak[0]:.0f} MB, after {after:.0f} MB")
    print(figures)
    assert all(status == 413 and took < 5 for status, took in bombs), bombs
    assert bomb_peak - before < 50, figures  # refused from their headers
    assert all(status == 200 for status, _ in allowed), allowed
    assert peak[0] - before < 450, figures  # two decodes at once (eight: ~650 MB)
    assert after - before < 150, figures
