"""Whether the Hugging Face Hub answers at all, asked once and quickly.

Without this, a machine with no network (and HF_HUB_OFFLINE unset) waits through
huggingface_hub's five retries, about 26 s, before the first error. `hub_unreachable` opens one
TCP connection to the endpoint's host (HF_ENDPOINT, else huggingface.co) with a short timeout,
in a thread so a hanging name lookup cannot hold it longer either. Behind a proxy
(HTTPS_PROXY, ALL_PROXY) the direct probe says nothing, so none is made.
"""

from __future__ import annotations

import os
import socket
import threading
from functools import cache
from urllib.parse import urlsplit

__all__ = ["PROBE_TIMEOUT_S", "hub_endpoint", "hub_unreachable"]

PROBE_TIMEOUT_S = 3.0
_PROXY_VARIABLES = ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


def hub_endpoint() -> str:
    """The Hub's address as huggingface_hub reads it: $HF_ENDPOINT, else huggingface.co."""
    return os.environ.get("HF_ENDPOINT") or "https://huggingface.co"


def hub_unreachable(endpoint: str | None = None) -> str | None:
    """Why the Hub cannot be reached (a short reason), or None when it answered or cannot be
    probed directly (a proxy is set). Asked once per endpoint and process."""
    if any(os.environ.get(v) for v in _PROXY_VARIABLES):
        return None
    return _probe(endpoint or hub_endpoint())


@cache
def _probe(endpoint: str) -> str | None:
    parts = urlsplit(endpoint)
    host = parts.hostname or endpoint
    port = parts.port or (80 if parts.scheme == "http" else 443)
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=PROBE_TIMEOUT_S).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"{host}:{port} did not answer: {exc.strerror or exc}")

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(PROBE_TIMEOUT_S + 0.5)
    if not outcome:
        return f"{host}:{port} did not answer within {PROBE_TIMEOUT_S:.0f} s"
    return outcome[0]
