"""`python -m vitkit serve` as a real process on a free localhost port: a bounded load test (no
errors, resident memory flat), and SIGTERM during a request: the request completes, the
process exits 0 and leaves no temporary files."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import pytest

from serve_models import png_bytes, save_classifier
from serve_process import SRC, rss_mb, server_output, start_server, stop_server

REQUESTS, CLIENTS = 1000, 32  # the bounded load: 1,000 requests from 32 clients
RSS_GROWTH_MB = 40  # bound on resident-memory growth over the load, after a warm-up


def _start(weights: Path, tmp: Path, *flags: str, **env_vars: str):
    """A server whose temporary files go to `tmp` (its log beside it)."""
    return start_server(weights, tmp.parent / "server.log", *flags, TMPDIR=str(tmp), **env_vars)


def test_load_gives_no_errors_and_flat_memory_then_sigterm_exits_0(tmp_path):
    weights = save_classifier(tmp_path / "model")
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    process, url = _start(weights, tmp, "--max-batch", "8", "--max-wait-ms", "5")
    try:
        images = [png_bytes(seed) for seed in range(8)]
        local = threading.local()

        def one(index: int) -> int:
            if not hasattr(local, "client"):
                local.client = httpx.Client(base_url=url, timeout=30)
            response = local.client.post("/api/predict",
                                         files={"file": (f"{index}.png", images[index % 8])})
            ok = response.status_code == 200 and \
                response.json()["predictions"][0]["path"] == f"{index}.png"
            return 0 if ok else 1

        with ThreadPoolExecutor(CLIENTS) as pool:
            warm = sum(pool.map(one, range(100)))
            before = rss_mb(process.pid)
            errors = sum(pool.map(one, range(REQUESTS)))
        after = rss_mb(process.pid)
        assert warm == 0 and errors == 0
        assert after - before < RSS_GROWTH_MB, f"RSS grew {before:.0f} -> {after:.0f} MB"
        batches = httpx.get(f"{url}/api/model").json()["batches"]
        assert batches["largest"] > 1 and batches["inputs"] >= REQUESTS + 100
    finally:
        output = stop_server(process)
    assert process.returncode == 0, output
    assert "Shutting down" in output or "Finished server process" in output
    assert list(tmp.iterdir()) == []


def test_sigterm_lets_an_in_flight_request_finish(tmp_path):
    weights = save_classifier(tmp_path / "model")
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    # a lone request waits 1.5 s in the batcher for company: in flight when SIGTERM comes
    process, url = _start(weights, tmp, "--max-wait-ms", "1500")
    result: dict = {}

    def slow() -> None:
        response = httpx.post(f"{url}/api/predict", timeout=30,
                              files={"file": ("slow.png", png_bytes(3))})
        result["status"], result["json"] = response.status_code, response.json()

    thread = threading.Thread(target=slow)
    thread.start()
    time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    thread.join(30)
    process.wait(timeout=60)
    output = server_output(process)
    assert result["status"] == 200, result
    assert result["json"]["predictions"][0]["path"] == "slow.png"
    assert process.returncode == 0, output
    assert list(tmp.iterdir()) == []


def test_the_token_from_the_environment_guards_the_api_and_stays_out_of_the_process_list(
        tmp_path):
    weights = save_classifier(tmp_path / "model")
    tmp = tmp_path / "tmpdir"
    tmp.mkdir()
    secret = "env-s3cret"
    process, url = _start(weights, tmp, VITKIT_SERVE_TOKEN=secret)
    try:
        assert httpx.get(f"{url}/api/model").status_code == 401
        headers = {"Authorization": f"Bearer {secret}"}
        assert httpx.get(f"{url}/api/model", headers=headers).status_code == 200
        assert secret not in Path(f"/proc/{process.pid}/cmdline").read_text()
    finally:
        output = stop_server(process)
    assert process.returncode == 0, output


def test_without_the_serve_extra_the_command_says_what_to_install():
    """With fastapi unimportable (None in sys.modules, as Python marks a module that is not
    there), `vitkit serve` names the extra to install instead of a traceback."""
    env = {**os.environ, "PYTHONPATH": str(SRC)}
    out = subprocess.run([sys.executable, "-c", "import sys; sys.modules['fastapi'] = None; "
                          "from vitkit.cli import main; sys.exit(main(['serve', 'x']))"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 2, out.stderr
    for part in ("vitkit serve", "fastapi", "not installed", "pip install 'vitkit[serve]'"):
        assert part in out.stderr, out.stderr
    assert "Traceback" not in out.stderr


def test_a_port_in_use_is_refused_before_anything_loads_and_another_port_serves(tmp_path):
    weights = save_classifier(tmp_path / "weights")
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        env = {**os.environ, "PYTHONPATH": str(SRC)}
        refused = subprocess.run([sys.executable, "-m", "vitkit", "serve", str(weights),
                                  "--port", str(port)], env=env, capture_output=True, text=True,
                                 timeout=120)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert refused.stderr.startswith("vitkit serve: error: "), refused.stderr
    for part in ("cannot listen", f"127.0.0.1:{port}", "another --port", f"--port {port + 1}"):
        assert part in refused.stderr, refused.stderr
    assert "Ctrl-C to stop" not in refused.stdout  # no success line first
    (tmp_path / "tmp").mkdir()
    process, url = _start(weights, tmp_path / "tmp")  # the advice: another port
    assert httpx.get(f"{url}/healthz", timeout=5).status_code == 200
    assert "Ctrl-C to stop" in stop_server(process)


def test_a_port_out_of_range_is_refused_by_the_arguments(capsys):
    from vitkit.cli import main

    with pytest.raises(SystemExit) as exited:
        main(["serve", "weights", "--port", "70000"])
    assert exited.value.code == 2
    err = capsys.readouterr().err
    for part in ("--port", "'70000'", "not a port", "0 to 65535"):
        assert part in err, err
