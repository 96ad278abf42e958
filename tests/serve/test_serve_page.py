"""The page of `vitkit serve` in a real headless browser: Debian's chromium driven by Selenium
through its own chromedriver (the `chromium-driver` package, so the two versions always match;
Playwright would drive chromium over a protocol pinned to its own bundled build, which cannot be
downloaded here). The real app (`create_app`) serves a tiny saved model from uvicorn in a
background thread on a free 127.0.0.1 port.

Without chromium these tests skip; `.ci/run` installs it and sets VITKIT_REQUIRE_BROWSER=1, which
turns a missing browser (or selenium, fastapi, uvicorn) into a failure.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from vitkit.config import ViTConfig
from vitkit.model.vit import VisionTransformer
from vitkit.weights import save_pretrained

REQUIRED = os.environ.get("VITKIT_REQUIRE_BROWSER") == "1"


def _found(variable: str, *candidates: str | None) -> str | None:
    """The program named by `variable` when set (only that one), else the first candidate
    that exists."""
    if os.environ.get(variable):
        candidates = (os.environ[variable],)
    return next((p for p in candidates if p and Path(p).is_file()), None)


CHROMIUM = _found("VITKIT_CHROMIUM", "/usr/bin/chromium", shutil.which("chromium"),
                  shutil.which("chromium-browser"))
CHROMEDRIVER = _found("VITKIT_CHROMEDRIVER", "/usr/bin/chromedriver", shutil.which("chromedriver"))
CLASSES = ["cat", "dog", "bird", "fish", "frog"]
WAIT = 30  # seconds for anything on the page to appear (two shared cores)


def _unavailable(reason: str) -> None:
    if REQUIRED:
        pytest.fail(f"{reason}, and VITKIT_REQUIRE_BROWSER=1 says the browser tests must run: "
                    "apt-get install chromium chromium-driver; pip install -e '.[dev]'")
    pytest.skip(f"{reason}: the page's browser tests need the serving app (fastapi, "
                "uvicorn, selenium) and Debian's chromium and chromium-driver (apt-get "
                "install chromium chromium-driver)")


def _import(name: str):
    try:
        return __import__(name)
    except ImportError:
        _unavailable(f"no {name} module")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


class Server:
    """uvicorn serving `app` on a free 127.0.0.1 port in a daemon thread."""

    def __init__(self, app) -> None:
        uvicorn = _import("uvicorn")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=self.port,
                                                    log_level="warning", lifespan="on"))
        self.thread = threading.Thread(target=self.server.run, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + WAIT
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError(f"uvicorn did not start on port {self.port}")
            time.sleep(0.05)

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=WAIT)


@pytest.fixture(scope="module")
def weights(tmp_path_factory) -> Path:
    """A tiny classifier (32x32, patch 4, 3 layers, 2 heads) with a random head, so that its
    probabilities differ from class to class, saved in vitkit's format."""
    torch.manual_seed(0)
    model = VisionTransformer(ViTConfig(img_size=(32, 32), patch_size=4, width=32, depth=3,
                                        num_heads=2, mlp_dim=64, num_classes=len(CLASSES),
                                        name="tiny"))
    torch.nn.init.normal_(model.head.weight, std=0.5)
    return save_pretrained(model, tmp_path_factory.mktemp("weights") / "tiny",
                           class_names=CLASSES)


@pytest.fixture(scope="module")
def service(weights):
    _import("fastapi")
    try:
        from vitkit.serve.service import ModelService
    except ImportError as exc:
        _unavailable(f"no serving app to test ({exc})")

    return ModelService.load(str(weights))


def _serve(service, **options) -> Iterator[Server]:
    from vitkit.serve.app import create_app

    server = Server(create_app(service, **options))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(service) -> Iterator[Server]:
    yield from _serve(service)


@pytest.fixture(scope="module")
def browser():
    if CHROMIUM is None or CHROMEDRIVER is None:
        _unavailable("no chromium or chromedriver found")
    webdriver = _import("selenium.webdriver").webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     "--disable-gpu", "--window-size=1280,900", "--no-first-run",
                     "--disable-extensions", "--disable-background-networking"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


@pytest.fixture()
def picture(tmp_path) -> Path:
    rng = np.random.default_rng(0)
    path = tmp_path / "picture.png"
    Image.fromarray(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8)).save(path)
    return path


def wait(driver, condition, what: str):
    from selenium.webdriver.support.ui import WebDriverWait

    return WebDriverWait(driver, WAIT, poll_frequency=0.05).until(
        lambda d: condition(d), message=f"timed out waiting for {what}")


def page(driver, url: str) -> None:
    """Open the page and wait until it has read /api/model."""
    driver.get(url)
    wait(driver, lambda d: d.find_element("id", "model-name").text not in ("", "loading…")
         or d.find_element("id", "error").is_displayed(), "the model's name or an error")


def upload(driver, path: Path) -> None:
    driver.find_element("id", "file-input").send_keys(str(path))


def shown_predictions(driver) -> list[tuple[str, float]]:
    bars = driver.find_elements("css selector", "#predictions .bar")
    return [(bar.get_attribute("data-label"), float(bar.get_attribute("data-prob")))
            for bar in bars]


def overlay_src(driver) -> str:
    return driver.execute_script("return document.getElementById('overlay').src || ''")


def api_post(url: str, route: str, path: Path, **fields) -> tuple[int, dict]:
    httpx = _import("httpx")
    response = httpx.post(f"{url}{route}", files={"file": (path.name, path.read_bytes())},
                          data={k: str(v) for k, v in fields.items()}, timeout=WAIT)
    return response.status_code, response.json()


def test_the_page_loads_and_shows_the_model(browser, server, service):
    page(browser, server.url)
    assert browser.find_element("id", "model-name").text == service.name
    assert browser.find_element("id", "model-task").text == "classification"
    assert browser.find_element("id", "model-grid").text == "8×8"
    assert browser.find_element("id", "model-precision").text.startswith("fp32")
    options = browser.find_elements("css selector", "#head-select option")
    assert [o.get_attribute("value") for o in options] == ["all", "0", "1"]
    slider = browser.find_element("id", "layer-slider")
    assert (slider.get_attribute("min"), slider.get_attribute("max"),
            slider.get_attribute("value")) == ("1", "3", "3")
    assert not browser.find_element("id", "error").is_displayed()


def test_an_upload_shows_the_predictions_of_the_api(browser, server, picture):
    page(browser, server.url)
    upload(browser, picture)
    wait(browser, lambda d: len(shown_predictions(d)) == 5, "five prediction bars")
    status, answer = api_post(server.url, "/api/predict", picture, topk=5)
    assert status == 200
    (expected,) = answer["predictions"]
    assert expected["path"] == "picture.png"
    assert browser.find_element("css selector", "#predictions h3").text == "picture.png"
    assert shown_predictions(browser) == [(row["label"], row["prob"])
                                          for row in expected["topk"]]
    probs = [prob for _, prob in shown_predictions(browser)]
    assert probs == sorted(probs, reverse=True) and probs[0] > probs[-1]  # not a flat head
    widths = browser.execute_script(
        "return [...document.querySelectorAll('#predictions .bar-fill')]"
        ".map(e => e.getBoundingClientRect().width)")
    assert widths[0] > widths[-1] > 0  # the bars are drawn to scale


def test_the_controls_change_the_overlay(browser, server, picture):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    page(browser, server.url)
    upload(browser, picture)
    wait(browser, lambda d: overlay_src(d).startswith("data:image/png;base64,"), "an overlay")
    at_depth = overlay_src(browser)
    status, answer = api_post(server.url, "/api/explain", picture, layer=3, head="all",
                              discard_ratio=0.0, fusion="mean")
    assert status == 200 and answer["overlay_png"] == at_depth  # the defaults: layer 3, rollout
    assert browser.find_element("id", "image").get_attribute("src") == answer["image_png"]

    slider = browser.find_element("id", "layer-slider")
    slider.send_keys(Keys.ARROW_LEFT)  # a real key press on the slider: layer 3 -> 2
    assert slider.get_attribute("value") == "2"
    wait(browser, lambda d: d.find_element("id", "overlay").get_attribute("data-layer") == "2",
         "the overlay of layer 2")
    at_two = overlay_src(browser)
    assert at_two != at_depth
    assert at_two == api_post(server.url, "/api/explain", picture, layer=2)[1]["overlay_png"]
    assert browser.find_element("id", "layer-value").text == "2"

    Select(browser.find_element("id", "head-select")).select_by_value("1")
    wait(browser, lambda d: d.find_element("id", "overlay").get_attribute("data-head") == "1",
         "the overlay of head 1")
    assert overlay_src(browser) not in (at_depth, at_two)
    assert not browser.find_element("id", "discard-slider").is_enabled()  # rollout only
    assert "head 2 at layer 2" in browser.find_element("id", "explain-caption").text


def test_the_figures_load(browser, server):
    page(browser, server.url)
    sizes = {}
    for name in ("attention_distance", "position_similarity", "filters"):
        script = (f"const i = document.getElementById('figure-{name}'); return i && "
                  "i.complete && i.naturalWidth ? [i.naturalWidth, i.naturalHeight] : null")
        sizes[name] = wait(browser, lambda d, s=script: d.execute_script(s), f"figure {name}")
    assert sizes["attention_distance"] == [500, 400]
    assert sizes["position_similarity"] == [650, 600]
    assert sizes["filters"][0] == 630


def test_an_invalid_file_shows_the_apis_error(browser, server, tmp_path):
    broken = tmp_path / "broken.png"
    broken.write_bytes(b"\x89PNG\r\n\x1a\n" + b"not really a picture" * 20)
    status, answer = api_post(server.url, "/api/predict", broken)
    assert 400 <= status < 500 and "broken.png" in answer["error"]
    page(browser, server.url)
    upload(browser, broken)
    box = wait(browser, lambda d: d.find_element("id", "error").is_displayed()
               and d.find_element("id", "error"), "the error message")
    assert box.text == f"{status}: {answer['error']}"
    assert shown_predictions(browser) == []
    assert browser.find_element("id", "model-name").text  # the page is still there


@pytest.fixture(scope="module")
def guarded(service) -> Iterator[Server]:
    yield from _serve(service, token="s3cret")


def test_a_token_in_the_address_is_sent_to_the_api(browser, guarded, service, picture):
    page(browser, f"{guarded.url}/?token=s3cret")
    assert browser.find_element("id", "model-name").text == service.name
    upload(browser, picture)
    wait(browser, lambda d: len(shown_predictions(d)) == 5, "predictions behind the token")
    wait(browser, lambda d: d.execute_script(
        "const i = document.getElementById('figure-filters'); return i && i.naturalWidth"),
        "a figure behind the token")
    page(browser, guarded.url)  # no token: the API's 401 message is shown
    error = browser.find_element("id", "error")
    assert error.is_displayed() and error.text.startswith("401: ") and "token" in error.text


def test_the_page_needs_nothing_from_elsewhere(server):
    """Offline: every asset the page names is served locally (no http(s):// or // URLs)."""
    httpx = _import("httpx")
    html = httpx.get(server.url, timeout=WAIT).text
    for asset in ("static/app.js", "static/style.css"):
        assert asset in html
        response = httpx.get(f"{server.url}/{asset}", timeout=WAIT)
        assert response.status_code == 200
        text = response.text
        assert "http://" not in text and "https://" not in text and "url(//" not in text
    assert "https://" not in html and 'src="//' not in html and 'href="//' not in html
    assert json.loads(httpx.get(f"{server.url}/healthz").text) == {"status": "ok"}


# -- uploads in flight, and what the page shows of them -----------------------------------------

def test_a_slower_earlier_upload_does_not_replace_the_last_ones_predictions(
        browser, server, picture, tmp_path, monkeypatch):
    """The page shows the predictions of the file chosen last, under its name, even when an
    earlier file's slower /api/predict answer comes back after them."""
    import vitkit.serve.app as app_module

    decode = app_module.decode_files

    def slow_for_slow_png(form, *args):
        if form.files and form.files[0].name == "slow.png":
            time.sleep(2.0)  # in the decoding thread: the other request goes on meanwhile
        return decode(form, *args)

    monkeypatch.setattr(app_module, "decode_files", slow_for_slow_png)
    slow = tmp_path / "slow.png"
    Image.fromarray(np.full((40, 48, 3), 200, dtype=np.uint8)).save(slow)
    page(browser, server.url)
    upload(browser, slow)
    upload(browser, picture)
    expected = api_post(server.url, "/api/predict", picture, topk=5)[1]["predictions"][0]
    wait(browser, lambda d: shown_predictions(d) == [(row["label"], row["prob"])
                                                     for row in expected["topk"]],
         "the last file's predictions")
    time.sleep(3.0)  # the slow answer has come back by now, and must have been dropped
    assert browser.find_element("css selector", "#predictions h3").text == "picture.png"
    assert shown_predictions(browser) == [(row["label"], row["prob"])
                                          for row in expected["topk"]]
    assert browser.find_element("id", "file-name").text == "picture.png"


def test_a_refused_upload_leaves_no_map_of_the_file_before(browser, server, picture, tmp_path):
    page(browser, server.url)
    upload(browser, picture)
    wait(browser, lambda d: overlay_src(d).startswith("data:image/png;base64,"), "an overlay")
    refused = tmp_path / "notes.png"
    refused.write_text("not a picture")
    upload(browser, refused)
    wait(browser, lambda d: d.find_element("id", "error").is_displayed(), "the error message")
    wait(browser, lambda d: overlay_src(d) == "", "the overlay cleared")
    assert browser.find_element("id", "image").get_attribute("src") in ("", None)
    assert browser.find_element("id", "explain-caption").text == ""
    assert browser.find_element("id", "file-name").text == "notes.png"


@pytest.fixture(scope="module")
def guarded_plus(service) -> Iterator[Server]:
    yield from _serve(service, token="s3cr+t/x=")


def test_a_token_with_a_plus_works_url_encoded_as_the_401_says(browser, guarded_plus, service):
    page(browser, f"{guarded_plus.url}/?token=s3cr+t/x=")  # '+' reads as a space
    error = browser.find_element("id", "error")
    assert error.is_displayed()
    for part in ("/?token=TOKEN", "URL-encoded", "%2B"):
        assert part in error.text, error.text
    page(browser, f"{guarded_plus.url}/?token=s3cr%2Bt%2Fx%3D")  # as the message says
    assert browser.find_element("id", "model-name").text == service.name
    assert not browser.find_element("id", "error").is_displayed()
