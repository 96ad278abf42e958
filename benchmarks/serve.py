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

`--hostile` instead runs one server (batching on) through a hostile mix: good clients post
normal predict requests for a calm phase, through a burst of --seconds (default 30) and for a
phase after it, while during the burst hostile clients (a) hold --stalled sockets open after
partial headers, or after full headers with a Content-Length and a few body bytes (a socket the
server drops is opened again), (b) post a PNG of 9400x9400 1-bit pixels (about 11 KB of file,
88 million pixels to decode) from --large clients at once, over and over, and (c) cycle through
bad uploads (garbage bytes, a truncated PNG, an empty multipart boundary, a JSON body). It
prints the good requests' success rate and p50/p99 per phase, the hostile answers by status,
the server's RSS sampled every 0.5 s (before, peak during, after, and a timeline) and whether
/healthz still answers. The server gets the protective flags its `vitkit serve --help` lists
(HOSTILE_FLAGS; the output names any it lacks). Default model: Ti/16 at 64x64 (random
weights): the hostile work costs the same whatever the model, and a small one leaves the
two-core machine the headroom to show what the hostile clients take from the good ones.

    python benchmarks/serve.py --hostile [--seconds 30] [--stalled 200] [--large 3]
"""

from __future__ import annotations

import argparse
import collections
import io
import os
import re
import selectors
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
from typing import Any

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
# --hostile: the server's protective flags at their defaults for this server (--max-queue: 8 x
# --max-batch 16), passed so the table states them; each only where `vitkit serve --help` lists
# it (a server from before the flag runs without it, and the output says so)
HOSTILE_FLAGS = {"--read-timeout": "10", "--keep-alive": "5", "--max-connections": "256",
                 "--max-queue": "128", "--max-pixels": "16777216", "--shutdown-grace": "5"}
BOMB_SIDE = 9400  # a 9400x9400 1-bit PNG: about 11 KB that decode into 88 million pixels


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _default_weights(folder: Path, img_size: int = 224) -> Path:
    from vitkit import create_model, save_pretrained

    model = create_model("Ti/16", num_classes=10, img_size=img_size)
    return save_pretrained(model, folder / f"ti16-{img_size}")


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


# --hostile ------------------------------------------------------------------------------------


def _server_flags() -> tuple[list[str], list[str]]:
    """HOSTILE_FLAGS split into those this `vitkit serve --help` lists, as arguments, and the
    names of those it does not."""
    shown = subprocess.run([sys.executable, "-m", "vitkit", "serve", "--help"],
                           env={**os.environ, "PYTHONPATH": str(SRC)}, capture_output=True,
                           text=True, timeout=120).stdout
    listed = set(re.findall(r"--[a-z][a-z-]*", shown))
    passed = [part for flag, value in HOSTILE_FLAGS.items() if flag in listed
              for part in (flag, value)]
    return passed, [flag for flag in HOSTILE_FLAGS if flag not in listed]


def _bomb() -> bytes:
    buffer = io.BytesIO()
    Image.new("1", (BOMB_SIDE, BOMB_SIDE)).save(buffer, "PNG")
    return buffer.getvalue()


def _status_of(response_start: bytes) -> str:
    """The status code of a raw HTTP answer's first bytes ('answer?' if it has none)."""
    match = re.match(rb"HTTP/1\.[01] (\d{3})", response_start)
    return match.group(1).decode() if match else "answer?"


def _stall_openings(port: int, count: int) -> list[bytes]:
    """What each stalled socket sends before it stops: half partial headers, half full headers
    announcing a 1 MB multipart body followed by a few of its bytes."""
    partial = (b"POST /api/predict HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
               b"Content-Type: multipart/form-data; bou" % port)
    body_start = b"--stall\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.png\"\r\n"
    announced = (b"POST /api/predict HTTP/1.1\r\nHost: 127.0.0.1:%d\r\n"
                 b"Content-Type: multipart/form-data; boundary=stall\r\n"
                 b"Content-Length: 1000000\r\n\r\n" % port) + body_start[:24]
    return [partial if i % 2 == 0 else announced for i in range(count)]


def _stallers(port: int, count: int, stop: threading.Event, record: dict) -> None:
    """Hold `count` sockets open, each stalled after its opening bytes; a socket the server
    answers or closes is recorded (its status, or how it ended, and how long it was held) and
    opened again, until `stop`; the sockets still open then are counted and closed."""
    openings = _stall_openings(port, count)
    chosen = selectors.DefaultSelector()
    outcomes: collections.Counter = record["outcomes"]

    def open_one(slot: int) -> None:
        sock = socket.socket()
        sock.settimeout(2)
        try:
            sock.connect(("127.0.0.1", port))
            sock.sendall(openings[slot])
        except OSError as exc:
            outcomes[f"connect failed ({type(exc).__name__})"] += 1
            sock.close()
            return
        sock.setblocking(False)
        record["opened"] += 1
        chosen.register(sock, selectors.EVENT_READ, (slot, time.monotonic()))

    for slot in range(count):
        open_one(slot)
    while not stop.is_set():
        ready = chosen.select(timeout=0.2)
        for key, _ in ready:
            sock, (slot, since) = key.fileobj, key.data
            try:
                data = sock.recv(4096)
                outcome = _status_of(data) if data else "closed, no answer"
            except ConnectionResetError:
                outcome = "reset"
            except BlockingIOError:
                continue
            outcomes[outcome] += 1
            record["held"].append(time.monotonic() - since)
            chosen.unregister(sock)
            sock.close()
            if not stop.is_set():
                open_one(slot)
        if not ready and len(chosen.get_map()) < count:  # connects refused: try again
            taken = {key.data[0] for key in chosen.get_map().values()}
            for slot in sorted(set(range(count)) - taken)[:10]:
                open_one(slot)
    record["open at end"] = len(chosen.get_map())
    for key in list(chosen.get_map().values()):
        chosen.unregister(key.fileobj)
        key.fileobj.close()


def _bad_uploads(image: bytes) -> dict[str, dict]:
    """The bad requests, each as httpx.Client.post keyword arguments."""
    return {
        "garbage bytes as image": {"files": {"file": ("x.png", os.urandom(4096), "image/png")}},
        "truncated PNG": {"files": {"file": ("x.png", image[:len(image) // 2], "image/png")}},
        "empty multipart boundary": {
            "content": b"--\r\nContent-Disposition: form-data; name=\"file\"\r\n\r\nx\r\n----\r\n",
            "headers": {"Content-Type": "multipart/form-data; boundary="}},
        "wrong content type (JSON)": {"content": b'{"file": "aGVsbG8="}',
                                      "headers": {"Content-Type": "application/json"}},
    }


def _poster(url: str, stop: threading.Event, requests: dict[str, dict], kinds: collections.Counter,
            record: collections.defaultdict) -> None:
    """Post `requests` (kind -> httpx arguments) in turn until `stop`; the status of each
    answer (or the transport error's name) counted per kind in `record`."""
    with httpx.Client(base_url=url, timeout=60) as session:
        while not stop.is_set():
            for kind, arguments in requests.items():
                if stop.is_set():
                    return
                kinds[kind] += 1
                try:
                    status = str(session.post("/api/predict", **arguments).status_code)
                except httpx.TransportError as exc:
                    status = type(exc).__name__
                record[kind][status] += 1


def _good_client(url: str, image: bytes, stop: threading.Event, lock: threading.Lock,
                 done: list[tuple[float, float, str]]) -> None:
    """Normal predict requests until `stop`: (start, seconds, status) of each."""
    with httpx.Client(base_url=url, timeout=60) as session:
        while not stop.is_set():
            start = time.monotonic()
            try:
                status = str(session.post("/api/predict", files={"file": ("x.png", image)})
                             .status_code)
            except httpx.TransportError as exc:
                status = type(exc).__name__
            with lock:
                done.append((start, time.monotonic() - start, status))


def _sample_rss(pid: int, stop: threading.Event, samples: list[tuple[float, float]]) -> None:
    while not stop.is_set():
        samples.append((time.monotonic(), _rss_mb(pid)))
        stop.wait(0.5)


def _vm_hwm_mb(pid: int) -> float:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except OSError:
        pass
    return 0.0


def _percentile(values: list[float], share: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(share * len(ordered)))]


def _thread(target: Any, *args: Any) -> threading.Thread:
    """A started daemon thread (one left hanging does not keep the benchmark alive)."""
    thread = threading.Thread(target=target, args=args, daemon=True)
    thread.start()
    return thread


def _hostile(args: argparse.Namespace, weights: Path) -> None:
    flags, missing = _server_flags()
    server_flags = [*MODES["on"], *flags]
    load_before = os.getloadavg()[0]
    process, url = _start(weights, server_flags, args.threads)
    port = int(url.rsplit(":", 1)[1])
    try:
        info = httpx.get(f"{url}/api/model").json()
        image = _image(max(info["img_size"]))
        bomb = _bomb()
        _load(url, 4, args.warmup, 60, image)
        lock, done, samples = threading.Lock(), [], []
        hostile_stop, good_stop, rss_stop = (threading.Event() for _ in range(3))
        stalled = {"opened": 0, "outcomes": collections.Counter(), "held": []}
        sent: collections.Counter = collections.Counter()
        answers: collections.defaultdict = collections.defaultdict(collections.Counter)
        sampler = _thread(_sample_rss, process.pid, rss_stop, samples)
        begin = time.monotonic()
        good = [_thread(_good_client, url, image, good_stop, lock, done)
                for _ in range(args.good)]
        time.sleep(args.calm)
        burst = time.monotonic()
        large = {f"{BOMB_SIDE}x{BOMB_SIDE} 1-bit PNG": {
            "files": {"file": ("bomb.png", bomb, "image/png")}}}
        hostile = [_thread(_stallers, port, args.stalled, hostile_stop, stalled),
                   *(_thread(_poster, url, hostile_stop, large, sent, answers)
                     for _ in range(args.large)),
                   _thread(_poster, url, hostile_stop, _bad_uploads(image), sent, answers)]
        time.sleep(args.seconds)
        hostile_stop.set()
        burst_end = time.monotonic()
        for thread in hostile:
            thread.join()
        hostile_joined = time.monotonic()
        time.sleep(args.calm)
        good_stop.set()
        for thread in good:
            thread.join()
        rss_stop.set()
        sampler.join()
        end = time.monotonic()
        try:
            health = httpx.get(f"{url}/healthz", timeout=10).status_code
        except httpx.TransportError as exc:
            health = type(exc).__name__
        alive = process.poll() is None
        hwm = _vm_hwm_mb(process.pid)
        load_after = os.getloadavg()[0]
    finally:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()

    name = info["name"] if args.weights else "Ti/16 (random weights)"
    print(f"model {name} ({info['config']['width']} wide, {info['depth']} layers, "
          f"{info['img_size'][0]}x{info['img_size'][1]}, {info['precision']}): small, so the "
          "two cores keep headroom and what the hostile clients take shows in the good ones' "
          "figures; decoding and refusing hostile uploads costs the same for any model")
    print(f"server: vitkit serve {' '.join(server_flags)}"
          + (f"; not in this server's --help, so not passed: {', '.join(missing)}"
             if missing else ""))
    print(f"{args.good} good clients post a {info['img_size'][0]}x{info['img_size'][1]} PNG "
          f"({len(image):,} bytes) as fast as answers come: {args.calm:g} s calm, a "
          f"{args.seconds:g} s burst, {args.calm:g} s after it. The burst: {args.stalled} stalled "
          "sockets (half stop inside the headers, half after full headers announcing a 1 MB "
          "body and 24 of its bytes; one the server drops is opened again); "
          f"{args.large} clients posting a {BOMB_SIDE}x{BOMB_SIDE} 1-bit PNG ({len(bomb):,} "
          f"bytes, {BOMB_SIDE * BOMB_SIDE / 1e6:.1f} million pixels) over and over; 1 client "
          "cycling bad uploads")
    print(f"load average (1 min) {load_before:.1f} before the run, {load_after:.1f} at its end "
          f"({os.cpu_count()} cores; the clients run on the server's cores)")
    phases = {"calm": (begin, burst), "burst": (burst, burst_end),
              "after": (hostile_joined, end)}
    print(f"\n{'good requests':<14}{'seconds':>8}{'sent':>7}{'200':>7}{'success':>9}"
          f"{'p50 ms':>8}{'p99 ms':>8}  other answers")
    for phase, (start, stop) in phases.items():
        rows = [(seconds, status) for began, seconds, status in done if start <= began < stop]
        ok = [seconds * 1000 for seconds, status in rows if status == "200"]
        others = collections.Counter(status for _, status in rows if status != "200")
        rate = f"{100 * len(ok) / len(rows):.1f}%" if rows else "-"
        p50 = f"{statistics.median(ok):.1f}" if ok else "-"
        p99 = f"{_percentile(ok, 0.99):.1f}" if ok else "-"
        print(f"{phase:<14}{stop - start:>8.1f}{len(rows):>7}{len(ok):>7}{rate:>9}{p50:>8}"
              f"{p99:>8}  {', '.join(f'{k}: {v}' for k, v in sorted(others.items())) or '-'}")
    if hostile_joined - burst_end > 0.5:
        print(f"(the hostile clients' last requests ended {hostile_joined - burst_end:.1f} s "
              "after the burst; good requests begun then count in neither phase)")
    print(f"\n{'hostile requests':<34}{'sent':>6}  answers by status (stalled sockets: "
          "opened, and how the server ended them)")
    held = stalled["held"]
    held_text = (f"; the server dropped them after a median {statistics.median(held):.1f} s"
                 if held else "")
    ended = ", ".join(f"{k}: {v}" for k, v in sorted(stalled["outcomes"].items()))
    print(f"{'stalled sockets':<34}{stalled['opened']:>6}  {ended or 'the server ended none'}; "
          f"{stalled['open at end']} still open at the end{held_text}")
    for kind in answers:
        print(f"{kind:<34}{sent[kind]:>6}  "
              + ", ".join(f"{k}: {v}" for k, v in sorted(answers[kind].items())))

    def rss_at(start: float, stop: float) -> list[float]:
        return [mb for at, mb in samples if start <= at < stop]

    before = rss_at(begin, burst)
    during = rss_at(burst, burst_end)
    after = rss_at(hostile_joined, end)
    peak = max(during, default=0.0)
    peak_at = next((at - burst for at, mb in samples if mb == peak and at >= burst), 0.0)
    print("\nserver RSS (sampled every 0.5 s): before the burst "
          f"{statistics.median(before):.0f} MB, peak during it {peak:.0f} MB (at "
          f"{peak_at:.1f} s), after it "
          f"{after[-1] if after else 0:.0f} MB; the kernel's peak (VmHWM) {hwm:.0f} MB")
    step = max(1, len(samples) // 12)
    print("timeline (s from the burst's start: MB): " + ", ".join(
        f"{at - burst:+.1f}: {mb:.0f}" for at, mb in samples[::step]))
    print(f"server stayed up: {'yes' if alive and health == 200 else 'NO'} (process "
          f"{'running' if alive else f'exited with {process.returncode}'}, /healthz after the "
          f"burst answered {health})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", help="weights to serve (default: Ti/16, random weights, "
                                          "at --img-size)")
    parser.add_argument("--img-size", type=int, help="the default model's input size (default "
                                                     "224; 64 with --hostile)")
    parser.add_argument("--requests", type=int, default=200,
                        help="per level and round (default 200)")
    parser.add_argument("--seconds", type=float,
                        help="per level and round, at most (default 15); with --hostile, the "
                             "burst (default 30)")
    parser.add_argument("--rounds", type=int, default=2, help="turns of each level (default 2)")
    parser.add_argument("--warmup", type=int, default=20, help="untimed requests per server")
    parser.add_argument("--threads", type=int, help="the server's torch threads")
    hostile = parser.add_argument_group("--hostile")
    hostile.add_argument("--hostile", action="store_true",
                         help="good clients beside stalled sockets, huge decodes and bad "
                              "uploads, against one server (batching on)")
    hostile.add_argument("--good", type=int, default=4, help="good clients (default 4)")
    hostile.add_argument("--stalled", type=int, default=200,
                         help="stalled sockets held open (default 200)")
    hostile.add_argument("--large", type=int, default=3,
                         help=f"clients posting the {BOMB_SIDE}x{BOMB_SIDE} PNG at once "
                              "(default 3)")
    hostile.add_argument("--calm", type=float, default=5.0,
                         help="seconds of good clients alone before and after the burst "
                              "(default 5)")
    readme_tables.add_flag(parser)
    args = parser.parse_args()
    if args.seconds is None:
        args.seconds = 30.0 if args.hostile else 15.0
    img_size = args.img_size or (64 if args.hostile else 224)
    table = "serve.py --hostile" if args.hostile else "serve.py"
    with readme_tables.recording(table, args.write_readme):

        print(cpu_description())
        with tempfile.TemporaryDirectory() as folder:
            weights = (Path(args.weights) if args.weights
                       else _default_weights(Path(folder), img_size))
            if args.hostile:
                _hostile(args, weights)
                return
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
