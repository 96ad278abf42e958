"""A real `vitkit serve` process for the tests that need sockets, signals or memory: started on
a free local port with its output in a file, stopped with SIGTERM, its resident memory read."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx

SRC = Path(__file__).resolve().parents[1] / "src"


def free_port() -> int:
    """A TCP port nobody listens on now, on 127.0.0.1."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start_server(weights: Path, log: Path, *flags: str, **env_vars: str
                 ) -> tuple[subprocess.Popen, str]:
    """`vitkit serve WEIGHTS --threads 1 FLAGS` on a free port, once /healthz answers; its
    output goes to the file `log` (a pipe nobody reads fills up at 64 KB, about 1,000
    access-log lines, and then blocks the server on its next line)."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(SRC), **env_vars}
    with log.open("w") as stream:
        process = subprocess.Popen([sys.executable, "-m", "vitkit", "serve", str(weights),
                                    "--port", str(port), "--threads", "1", *flags], env=env,
                                   stdout=stream, stderr=subprocess.STDOUT, text=True)
    process.log_path = log
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the server exited: {server_output(process)}")
        try:
            if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.2)
    process.kill()
    raise AssertionError("the server did not start in 60 s")


def server_output(process: subprocess.Popen) -> str:
    """What the server has printed so far."""
    return process.log_path.read_text()


def stop_server(process: subprocess.Popen) -> str:
    """SIGTERM (unless it has ended), wait for the exit, and what the server printed."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=60)
    return server_output(process)


def rss_mb(pid: int) -> float:
    """The resident memory of process `pid`, in MB (from /proc)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError("no VmRSS")
