"""Screenshot of the `vitkit serve` page with a prediction and an attention overlay shown
(docs/images/serve-page.png): serves WEIGHTS on a free 127.0.0.1 port, opens the page in
headless chromium (Selenium and Debian's chromedriver), uploads IMAGE, waits for the
predictions, the overlay and the three figures, and saves a 1280x900 PNG.

    python tools/serve_screenshot.py runs/digits src/vitkit/data/samples/digit_3.png \
        docs/images/serve-page.png
"""

from __future__ import annotations

import argparse
import socket
import threading
import time
from pathlib import Path

import uvicorn
from selenium import webdriver
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.support.ui import WebDriverWait

from vitkit.serve.app import create_app
from vitkit.serve.service import ModelService

FIGURES_READY = ("return ['attention_distance', 'position_similarity', 'filters'].every(n => {"
                 "const i = document.getElementById('figure-' + n); "
                 "return i && i.complete && i.naturalWidth > 0; })")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("weights")
    parser.add_argument("image", type=Path)
    parser.add_argument("out", type=Path)
    parser.add_argument("--size", default="1280,900", help="window width,height in pixels")
    parser.add_argument("--chromium", default="/usr/bin/chromium")
    parser.add_argument("--chromedriver", default="/usr/bin/chromedriver")
    args = parser.parse_args()

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(ModelService.load(args.weights)),
                                           host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)

    options = webdriver.ChromeOptions()
    options.binary_location = args.chromium
    for argument in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage",
                     f"--window-size={args.size}", "--hide-scrollbars"):
        options.add_argument(argument)
    driver = webdriver.Chrome(service=Service(args.chromedriver), options=options)
    width, height = (int(v) for v in args.size.split(","))
    driver.execute_cdp_cmd("Emulation.setDeviceMetricsOverride",  # the page, not the window
                           {"width": width, "height": height, "deviceScaleFactor": 1,
                            "mobile": False})
    try:
        driver.get(f"http://127.0.0.1:{port}/")
        wait = WebDriverWait(driver, 120)
        driver.find_element("id", "file-input").send_keys(str(args.image.resolve()))
        wait.until(lambda d: d.find_elements("css selector", "#predictions .bar, .value"))
        wait.until(lambda d: (d.find_element("id", "overlay").get_attribute("src") or "")
                   .startswith("data:image/png"))
        wait.until(lambda d: d.execute_script(FIGURES_READY))
        time.sleep(0.3)  # let the last images paint
        args.out.parent.mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(args.out))
    finally:
        driver.quit()
        server.should_exit = True
        thread.join(timeout=10)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
