"""`vitkit serve` under load: throughput and latency at 1, 8 and 32 concurrent clients, with
dynamic batching on (--max-batch 16 --max-wait-ms 5) against off (--max-batch 1, one request
at a time through the model).

Each mode has its own server (`python -m vitkit serve`, a subprocess on a free localhost
port), both started up front; the clients are threads with their own httpx connection, each
posting one image per request to /api/predict as fast as answers come. The two modes take
turns level by level for --rounds rounds (on, off at 1 client, then off, on at 8, ...; the
order alternates), so a slow moment of a shared machine hits both; each row pools its rounds'
requests. Each level is bounded by --requests and --seconds per round, after --warmup untimed
requests per server. The clients share the machine's cores with the server (localhost).
Default model: Ti/16 at 224 with random weights (saved to a temporary folder, removed at the
end); --weights serves any weights vitkit reads.

    python benchmarks/serve.py [--weights PATH] [--requests 200] [--seconds 15] [--rounds 2]
"""

from __future__ import annotations

import argparse
import io
import os
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
from PIL import Image

SRC = Path(__file__).resolve().parents[1] / "src"
sys.path.insert(0, str(SRC))

sys.path.append(str(Path(__file__).resolve().parent))  # readme_tables, for importers

import readme_tables  # noqa: E402
from vitkit.runtime import cpu_description  # noqa: E402

MODES = {"on": ["--max-batch", "16", "--max-wait-ms", "5"], "off": ["--max-batch", "1"]}
CLIENTS = (1, 8, 32)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _default_weights(folder: Path) -> Path:
    from vitkit import create_model, save_pretrained

    model = create_model("Ti/16", num_classes=10)
    return save_pretrained(model, folder / "ti16")


def _start(weights: Path, flags: list[str], threads: int | None) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    extra = ["--threads", str(threads)] if threads else []
    process = subprocess.Popen([sys.executable, "-m", "vitkit", "serve", str(weights), "--port",
                                str(port), *flags, *extra],
                               env={**os.environ, "PYTHONPATH": str(SRC)},
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the server exited with status {process.returncode}")
        try:
            httpx.get(f"{url}/healthz", timeout=1)
            return process, url
        except httpx.TransportError:
            time.sleep(0.3)
    process.kill()
    raise SystemExit("the server did not start in 120 s")


def _rss_mb(pid: int) -> float:
    """Resident memory of process `pid` in MB (Linux; 0 where /proc cannot tell)."""
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _image(size: int = 224) -> bytes:
    buffer = io.BytesIO()
    pixels = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(buffer, "PNG")
    return buffer.getvalue()


def _load(url: str, clients: int, requests: int, seconds: float, image: bytes
          ) -> dict[str, float]:
    """Run `requests` (at most `seconds`) from `clients` threads; latencies and rates."""
    latencies: list[float] = []
    errors = 0
    lock = threading.Lock()
    issued = iter(range(requests))
    stop = time.monotonic() + seconds

    def client() -> None:
        nonlocal errors
        with httpx.Client(base_url=url, timeout=60) as session:
            while time.monotonic() < stop:
                with lock:
                    if next(issued, None) is None:
                        return
                start = time.perf_counter()
                response = session.post("/api/predict", files={"file": ("x.png", image)})
                elapsed = time.perf_counter() - start
                with lock:
                    latencies.append(elapsed)
                    errors += response.status_code != 200

    begin = time.perf_counter()
    with ThreadPoolExecutor(clients) as pool:
        for _ in range(clients):
            pool.submit(client)
    return {"latencies": latencies, "errors": errors, "wall": time.perf_counter() - begin}


def _pooled(rounds: list[dict]) -> dict[str, float]:
    """One row from the rounds of a level: requests per second over their summed time, the
    latency percentiles of all their requests."""
    ordered = sorted(x for one in rounds for x in one["latencies"])
    wall = sum(one["wall"] for one in rounds)
    return {"requests": len(ordered), "errors": sum(one["errors"] for one in rounds),
            "rps": len(ordered) / wall, "p50": 1000 * statistics.median(ordered),
            "p99": 1000 * ordered[min(len(ordered) - 1, int(0.99 * len(ordered)))]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", help="weights to serve (default: Ti/16, random, 224)")
    parser.add_argument("--requests", type=int, default=200,
                        help="per level and round (default 200)")
    parser.add_argument("--seconds", type=float, default=15.0,
                        help="per level and round, at most (default 15)")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each level (default 2)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests per server")
    parser.add_argument("--threads", type=int, help="the server's torch threads")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    with readme_tables.recording("serve.py", args.write_readme):

        print(cpu_description())
        with tempfile.TemporaryDirectory() as folder:
            weights = Path(args.weights) if args.weights else _default_weights(Path(folder))
            servers = {}
            try:
                for mode, flags in MODES.items():
                    servers[mode] = _start(weights, flags, args.threads)
                info = httpx.get(f"{servers['on'][1]}/api/model").json()
                image = _image(max(info["img_size"]))
                for _, url in servers.values():
                    _load(url, 4, args.warmup, args.seconds, image)
                rss = {mode: [_rss_mb(process.pid)] for mode, (process, _) in servers.items()}
                rounds: dict[tuple[str, int], list[dict]] = {}
                turn = 0
                for _ in range(args.rounds):
                    for clients in CLIENTS:
                        order = list(MODES) if turn % 2 == 0 else list(MODES)[::-1]
                        turn += 1
                        for mode in order:
                            rounds.setdefault((mode, clients), []).append(_load(
                                servers[mode][1], clients, args.requests, args.seconds, image))
                for mode, (process, _) in servers.items():
                    rss[mode].append(_rss_mb(process.pid))
            finally:
                for process, _ in servers.values():
                    process.send_signal(signal.SIGTERM)
                    process.wait(60)
        results = {key: _pooled(value) for key, value in rounds.items()}
        name = info["name"] if args.weights else "Ti/16 (random weights)"
        print(f"model {name} ({info['config']['width']} wide, {info['depth']} layers, "
              f"{info['img_size'][0]}x{info['img_size'][1]}, {info['precision']}); one image per "
              "request; batching on = --max-batch 16 --max-wait-ms 5, off = --max-batch 1; "
              f"at most {args.requests} requests or {args.seconds:g} s per level in each of "
              f"{args.rounds} alternating rounds")
        print(f"{'batching':<9}{'clients':>8}{'requests':>9}{'errors':>7}{'req/s':>8}"
              f"{'images/s':>9}{'p50 ms':>8}{'p99 ms':>8}{'on/off req/s':>14}{'on/off p50':>11}")
        for clients in CLIENTS:
            for mode in MODES:
                row = results[mode, clients]
                off = results["off", clients]
                speedup, latency = row["rps"] / off["rps"], row["p50"] / off["p50"]
                ratios = f"{speedup:>13.2f}x{latency:>10.2f}x" if mode == "on" else ""
                print(f"{mode:<9}{clients:>8}{row['requests']:>9}{row['errors']:>7}"
                      f"{row['rps']:>8.1f}{row['rps']:>9.1f}{row['p50']:>8.1f}{row['p99']:>8.1f}"
                      f"{ratios}")
        print("server resident memory after the warm-up -> after every level: " + ", ".join(
            f"batching {mode} {before:.0f} -> {after:.0f} MB" for mode, (before, after)
            in rss.items()))


if __name__ == "__main__":
    main()
