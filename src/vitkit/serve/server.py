"""uvicorn, set up for clients `vitkit serve` does not control: every connection and the
shutdown are bounded in time, the connections in number, and the log in size.

- **Read timeout**: a request's headers must arrive whole within `read_timeout` seconds (of
  the connection's opening for its first request, of its first byte for later ones), and its
  body may pause no longer than that between two reads. A client that stalls is answered 408
  (when it has sent part of a request and no answer has begun) and dropped; one that sent
  nothing is dropped without a word. uvicorn's h11 protocol has no such timer: `_Bounded`
  adds one per connection (`loop.call_later`, restarted as the request advances).
- **Connections**: past `max_connections` open at once, a new connection's request gets 503
  with `Retry-After`. The process's open-file limit is raised to fit, as far as the hard
  limit allows (`raise_open_file_limit`).
- **Keep-alive**: an idle connection between requests closes after `keep_alive` seconds.
- **Shutdown**: SIGTERM or SIGINT stops accepting and lets the requests in flight finish; at
  `shutdown_grace` seconds every connection still open is dropped (its request sees the
  client gone), so the process ends then whatever the clients do. A second signal drops
  them at once. Either way the exit is quiet: status 0, no traceback.
- **Log**: one access-log line per request, the value of a `token` query parameter shown as
  `***`; uvicorn's per-connection warnings (a garbled request, a dropped connection) at most
  once per message every `LOG_WINDOW_S` seconds, with the count of those left out.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import signal
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType
from typing import Any, ClassVar
from urllib.parse import unquote_plus

import h11
import uvicorn
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.utils import get_client_addr, get_path_with_query_string

from vitkit.serve.app import RETRY_AFTER_S

__all__ = ["Limits", "raise_open_file_limit", "redact_token", "serve"]

LOG_WINDOW_S = 10.0  # one warning per message per window
FILES_MARGIN = 64  # open files the process needs beside its connections (model, logs, pipes)
CANCEL_AFTER_S = 1.0  # after the grace: how long a request still in the model may run on

log = logging.getLogger("uvicorn.error")  # where uvicorn's own connection warnings go


@dataclass(frozen=True)
class Limits:
    """The bounds of `serve`, in seconds and connections (the verb's flags give defaults)."""

    read_timeout: float
    keep_alive: float
    max_connections: int
    shutdown_grace: float


def serve(app: Any, host: str, port: int, limits: Limits) -> bool:
    """Serve `app` on `host:port` until SIGINT/SIGTERM, within `limits`; whether it started."""
    note = raise_open_file_limit(limits.max_connections + FILES_MARGIN)
    if note:
        print(f"vitkit serve: {note}", file=sys.stderr, flush=True)
    protocol = type("BoundedH11Protocol", (_Bounded,), {"limits": limits})
    config = uvicorn.Config(app, host=host, port=port, log_level="info", http=protocol,
                            ws="none", timeout_keep_alive=limits.keep_alive,  # type: ignore[arg-type]
                            timeout_graceful_shutdown=limits.shutdown_grace + CANCEL_AFTER_S)  # type: ignore[arg-type]
    quiet_logs()  # after Config: it configures uvicorn's loggers
    server = _Server(config, limits.shutdown_grace)
    with _signals_end_quietly():
        server.run()
    return server.started


def redact_token(path: str) -> str:
    """`path` with the value of each `token` query parameter as `***` (the key compared as
    Starlette reads it: percent- and plus-decoded)."""
    base, mark, query = path.partition("?")
    if not mark:
        return path
    parts = [f"{key}=***" if unquote_plus(key) == "token" else part
             for part in query.split("&") for key in [part.partition("=")[0]]]
    return f"{base}?{'&'.join(parts)}"


def raise_open_file_limit(need: int) -> str | None:
    """Raise this process's soft open-file limit to `need`, as far as the hard limit allows;
    a one-line note when it stays below (None when it fits or cannot be read)."""
    try:
        import resource
    except ImportError:  # not on this system (Windows)
        return None
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY or soft >= need:
        return None
    target = need if hard == resource.RLIM_INFINITY else min(need, hard)
    if target > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
    if soft >= need:
        return None
    return (f"the open-file limit is {soft} (hard limit {hard}), under --max-connections + "
            f"{FILES_MARGIN}: past about {max(soft - FILES_MARGIN, 0)} connections the system "
            "refuses new ones; raise it (ulimit -n) or pass a lower --max-connections")


def quiet_logs() -> None:
    """Redact the token in uvicorn's access log; rate-limit its connection warnings and
    asyncio's report of the open-file limit reached."""
    access = logging.getLogger("uvicorn.access")
    if not any(isinstance(f, _RedactToken) for f in access.filters):
        access.addFilter(_RedactToken())
    for logger in (log, logging.getLogger("asyncio")):
        if not any(isinstance(f, _FewWarnings) for f in logger.filters):
            logger.addFilter(_FewWarnings())


class _RedactToken(logging.Filter):
    """uvicorn's access record is (client, method, path with query, HTTP version, status)."""

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and len(args) >= 3 and isinstance(args[2], str):
            record.args = (*args[:2], redact_token(args[2]), *args[3:])
        return True


class _FewWarnings(logging.Filter):
    """At most one warning per message template every LOG_WINDOW_S seconds (the next one
    shown says how many were left out); a task cancelled by the shutdown, and asyncio's
    accept failing at the open-file limit, as one such warning instead of a traceback."""

    def __init__(self) -> None:
        super().__init__()
        self.shown: dict[str, float] = {}
        self.left_out: dict[str, int] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if _cancelled(record):
            _as_warning(record, "work still running at the end of the shutdown was cancelled "
                                "(--shutdown-grace, or a second signal)")
        elif str(record.msg).startswith("socket.accept() out of system resource"):
            _as_warning(record, "vitkit serve: the open-file limit is reached: new connections "
                                "wait (raise it with ulimit -n, or lower --max-connections)")
        if record.levelno != logging.WARNING:
            return True
        key, now = str(record.msg), time.monotonic()
        if now - self.shown.get(key, -LOG_WINDOW_S) < LOG_WINDOW_S:
            self.left_out[key] = self.left_out.get(key, 0) + 1
            return False
        self.shown[key] = now
        count = self.left_out.pop(key, 0)
        if count:
            record.msg = f"{key} (and {count} more like it in the {LOG_WINDOW_S:g} s before)"
        return True


def _as_warning(record: logging.LogRecord, message: str) -> None:
    """Make `record` the one-line warning `message`, its traceback dropped."""
    record.msg, record.args = message, ()
    record.exc_info = record.exc_text = None
    record.levelno, record.levelname = logging.WARNING, "WARNING"


def _cancelled(record: logging.LogRecord) -> bool:
    """Whether `record` reports a task cancelled by the shutdown: a request's (uvicorn logs
    the exception) or the app's lifespan at a forced exit (Starlette sends the formatted
    traceback as the message)."""
    if record.exc_info:
        return isinstance(record.exc_info[1], asyncio.CancelledError)
    text = str(record.msg)
    return text.startswith("Traceback") and text.rstrip().endswith("CancelledError")


def _json_response(status: int, reason: str, message: str, *extra: str) -> bytes:
    """A whole HTTP/1.1 response that closes the connection, its body {"error": message}."""
    body = json.dumps({"error": message}).encode()
    head = [f"HTTP/1.1 {status} {reason}", "content-type: application/json",
            f"content-length: {len(body)}", "connection: close", *extra]
    return ("\r\n".join(head) + "\r\n\r\n").encode() + body


def _busy(limit: int) -> Any:
    """The ASGI app answering a connection past the cap: 503 with Retry-After."""
    body = json.dumps({"error": f"the server has {limit} connections open, its limit "
                                f"(--max-connections): retry after {RETRY_AFTER_S} s"}).encode()
    headers = [(b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()),
               (b"retry-after", str(RETRY_AFTER_S).encode()), (b"connection", b"close")]

    async def busy(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 503, "headers": headers})
        await send({"type": "http.response.body", "body": body})

    return busy


class _Bounded(H11Protocol):
    """uvicorn's h11 protocol with a read timer and the connection cap (see the module)."""

    limits: ClassVar[Limits]

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._timer: asyncio.TimerHandle | None = None
        self._waiting = ""  # what the timer waits for: "headers", "body" or ""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        if len(self.connections) > self.limits.max_connections:
            self.app = _busy(self.limits.max_connections)
        self._arm("headers")

    def data_received(self, data: bytes) -> None:
        super().data_received(data)
        self._watch()

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._watch()

    def connection_lost(self, exc: Exception | None) -> None:
        self._arm("")
        super().connection_lost(exc)

    def _watch(self) -> None:
        """Set the timer for what the connection waits for now: the rest of the headers (one
        deadline from their first byte), the next piece of body (restarted by each), or
        nothing (the request is in; between requests uvicorn's keep-alive timer runs)."""
        state = self.conn.their_state
        if self.transport.is_closing():
            self._arm("")
        elif state is h11.SEND_BODY:
            self._arm("body")
        elif state is h11.IDLE and self.conn.trailing_data[0]:
            if self._waiting != "headers":
                self._arm("headers")
        elif not (state is h11.IDLE and self._waiting == "headers"):
            self._arm("")

    def _arm(self, what: str) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._timer, self._waiting = None, what
        if what:
            self._timer = self.loop.call_later(self.limits.read_timeout, self._timed_out)

    def _timed_out(self) -> None:
        what, self._timer, self._waiting = self._waiting, None, ""
        if self.transport.is_closing():
            return
        if what == "body" and self.flow.read_paused:  # the app has not read what came yet
            self._arm("body")
            return
        seconds = f"{self.limits.read_timeout:g}"
        message = (f"the request did not arrive within --read-timeout {seconds} s: send the "
                   "headers and body without pausing")
        client = f"{self.client[0]}:{self.client[1]}" if self.client else "-"
        if what == "headers" and self.conn.trailing_data[0]:
            log.warning("%s - 408: dropped a connection whose request headers did not arrive "
                        "within the read timeout", client)
            self.transport.write(_json_response(408, "Request Timeout", message))
        elif what == "headers":
            log.warning("%s - dropped a connection that sent nothing within the read timeout",
                        client)
        elif not self.cycle.response_started:
            if self.access_log:
                scope = self.scope
                self.access_logger.info('%s - "%s %s HTTP/%s" %d', get_client_addr(scope),
                                        scope["method"], get_path_with_query_string(scope),
                                        scope["http_version"], 408)
            self.transport.write(_json_response(408, "Request Timeout", message))
        self.transport.close()  # the request, if any, sees the client gone


class _Server(uvicorn.Server):
    """uvicorn's server with a bounded shutdown: connections still open `grace` seconds after
    the first signal are dropped; a second signal drops them at once."""

    def __init__(self, config: uvicorn.Config, grace: float) -> None:
        super().__init__(config)
        self.grace = grace
        self._loop: asyncio.AbstractEventLoop | None = None

    async def serve(self, sockets: Any = None) -> None:
        self._loop = asyncio.get_running_loop()
        await super().serve(sockets)

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if self.should_exit:  # a second signal: stop waiting for the clients
            self.force_exit = True
            if self._loop is not None and not self._loop.is_closed():
                self._loop.call_soon_threadsafe(self._drop_connections, "a second signal")
        super().handle_exit(sig, frame)

    async def shutdown(self, sockets: Any = None) -> None:
        late = asyncio.get_running_loop().call_later(
            self.grace, self._drop_connections, f"--shutdown-grace {self.grace:g} s")
        try:
            await super().shutdown(sockets)
        finally:
            late.cancel()

    def _drop_connections(self, why: str) -> None:
        open_now = [c for c in self.server_state.connections if not c.transport.is_closing()]
        if open_now:
            log.info("Dropping %d connection(s) still open after %s", len(open_now), why)
        for connection in open_now:
            connection.transport.abort()


@contextlib.contextmanager
def _signals_end_quietly() -> Iterator[None]:
    """uvicorn handles SIGINT/SIGTERM itself while it serves and raises the signal again once
    done; this makes that raise end the process with status 0 instead of a KeyboardInterrupt
    or a death by signal."""
    previous = {sig: signal.signal(sig, lambda *_: None)
                for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
