"""`vitkit serve WEIGHTS`: the verb's arguments and what it runs (uvicorn on `create_app`).

This module imports only argparse at load time (`vitkit.cli.serve` builds the verb's parser
from here); FastAPI, uvicorn and the model load when the verb runs.
"""

from __future__ import annotations

import argparse
import errno
import importlib.util
import ipaddress
import logging
import os
import socket
import sys
from typing import Any

from vitkit.arguments import (
    EAGER_INT8,
    add_int8_arguments,
    add_merge_tokens_argument,
    add_precision_argument,
    add_tta_argument,
    add_weights_argument,
    inference_options,
    non_negative_float,
    positive_float,
    positive_int,
)
from vitkit.errors import ConfigError

__all__ = ["TOKEN_ENV", "add_limit_arguments", "add_serve_verb", "check_port_free", "cmd_serve",
           "is_loopback", "resolve_token"]

TOKEN_ENV = "VITKIT_SERVE_TOKEN"  # the token, when --token is not given

log = logging.getLogger(__name__)

def add_serve_verb(verbs: Any) -> argparse.ArgumentParser:
    """The `serve` subparser, with the flags it shares with predict (`vitkit.arguments`)."""
    serve = verbs.add_parser("serve", help="a local web page of the model's attention and a "
                                           "JSON prediction API (docs/serve.md)")
    add_weights_argument(serve)
    add_precision_argument(serve)
    add_merge_tokens_argument(serve)
    add_int8_arguments(serve, EAGER_INT8)
    add_tta_argument(serve)
    serve.add_argument("--host", default="127.0.0.1",
                       help="address to listen on (default 127.0.0.1: this machine only; "
                            "another address needs --token, or --insecure-no-token)")
    serve.add_argument("--port", type=port_number, default=8000,
                       help="port, 0 to 65535 (default 8000; 0: any free port)")
    serve.add_argument("--max-batch", type=positive_int, default=8,
                       help="inputs run through the model together at most (default 8; 1: no "
                            "batching)")
    serve.add_argument("--max-wait-ms", type=non_negative_float, default=5.0,
                       help="how long the first queued request waits for others to batch "
                            "with (default 5 ms)")
    serve.add_argument("--max-upload-mb", type=positive_float, default=20.0,
                       help="largest request body, refused with 413 above (default 20 MB)")
    serve.add_argument("--max-pixels", type=positive_int,
                       help="most pixels one uploaded image may decode to, read from its "
                            "header and refused with 413 above before decoding; a request "
                            "holds at most --max-batch times that (default: 16 times the "
                            "model's input pixels, at least 4096x4096 = 16,777,216)")
    serve.add_argument("--token", help="require 'Authorization: Bearer TOKEN' on /api/ routes "
                                       "(set one when --host is not loopback; default: the "
                                       f"{TOKEN_ENV} environment variable, which, unlike "
                                       "the command line, other users cannot read in the "
                                       "process list)")
    serve.add_argument("--threads", type=positive_int,
                       help="torch intra-op threads for the model (default: torch's)")
    serve.add_argument("--insecure-no-token", action="store_true",
                       help="serve a non-loopback --host without a token (refused otherwise): "
                            "anyone who can reach the address can use the model")
    add_limit_arguments(serve)
    serve.set_defaults(run=cmd_serve)
    return serve


def is_loopback(host: str) -> bool:
    """Whether `host` listens on this machine only (127.x, ::1, localhost)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def add_limit_arguments(serve: argparse.ArgumentParser) -> None:
    """The bounds on what clients can hold (`vitkit.serve.server` applies them)."""
    serve.add_argument("--read-timeout", type=positive_float, default=10.0, metavar="SECONDS",
                       help="a request's headers must arrive within this, and its body pause "
                            "no longer; a client that stalls gets 408 and is dropped "
                            "(default 10)")
    serve.add_argument("--keep-alive", type=positive_float, default=5.0, metavar="SECONDS",
                       help="an idle connection between requests closes after this "
                            "(default 5)")
    serve.add_argument("--max-connections", type=positive_int, default=256,
                       help="connections open at once; past it a request gets 503 with "
                            "Retry-After (default 256)")
    serve.add_argument("--max-queue", type=positive_int,
                       help="requests waiting for the model at once; past it 503 with "
                            "Retry-After (default 8 x --max-batch, at least 64)")
    serve.add_argument("--shutdown-grace", type=non_negative_float, default=5.0,
                       metavar="SECONDS",
                       help="on SIGTERM/Ctrl-C, how long requests in flight may finish "
                            "before their connections are dropped and the process ends; a "
                            "second signal ends at once (default 5)")


def resolve_token(args: argparse.Namespace) -> str | None:
    """The token (--token, else the environment), refused when empty, or missing on a
    non-loopback --host without --insecure-no-token."""
    given = args.token if args.token is not None else os.environ.get(TOKEN_ENV)
    source = "--token" if args.token is not None else TOKEN_ENV
    if given is not None and not given.strip():
        raise ConfigError(f"{source} is empty: an empty token would let anyone in. Set a "
                          f"long random one (e.g. {TOKEN_ENV}=\"$(openssl rand -hex 16)\"), "
                          f"or unset {TOKEN_ENV} and leave out --token to serve without one "
                          "on 127.0.0.1")
    if given is None and not is_loopback(args.host):
        if not args.insecure_no_token:
            raise ConfigError(f"--host {args.host} is reachable from other machines and no "
                              f"token is set: set one ({TOKEN_ENV}=TOKEN, or --token TOKEN; "
                              "clients send 'Authorization: Bearer TOKEN'), bind --host "
                              "127.0.0.1, or pass --insecure-no-token to serve it open")
        print(f"vitkit serve: WARNING: listening on {args.host} without a token "
              "(--insecure-no-token): anyone who can reach this address can use the model.",
              file=sys.stderr)
    return given.strip() if given is not None else None


SERVE_PACKAGES = {"fastapi": "fastapi", "uvicorn": "uvicorn", "multipart": "python-multipart"}


def require_serve_packages() -> None:
    """Refuse clearly when the serve extra is not installed."""
    missing = [name for module, name in SERVE_PACKAGES.items()
               if importlib.util.find_spec(module) is None]
    if missing:
        raise ConfigError(f"vitkit serve needs {', '.join(missing)}, not installed here: "
                          "pip install 'vitkit[serve]'")


def port_number(text: str) -> int:
    """A TCP port (0 to 65535), for argparse."""
    try:
        port = int(text)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: give a number from 0 to "
                                         "65535 (e.g. 8000)")
    return port


def check_port_free(host: str, port: int) -> None:
    """Refuse a host and port the server could not listen on (another server has the port,
    or the address is not this machine's), naming --port, before anything is printed."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as uvicorn binds
        if family == socket.AF_INET6:
            probe.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)  # as asyncio binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            shown = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
            raise ConfigError(f"cannot listen on {shown} ({exc.strerror}): "
                              f"{_listen_fix(exc, port)}") from None


def _listen_fix(exc: OSError, port: int) -> str:
    """What to change when the server cannot listen, by the error's kind."""
    if exc.errno == errno.EADDRINUSE:
        return (f"another server holds port {port}: pass another --port (e.g. --port "
                f"{port + 1}), or stop that server")
    if exc.errno == errno.EACCES:
        return ("ports below 1024 need administrator rights: pass a --port of 1024 or more "
                "(e.g. --port 8000)")
    return "--host must be an address of this machine (e.g. 127.0.0.1, or 0.0.0.0 for all)"


def cmd_serve(args: argparse.Namespace) -> int:
    """Load the weights, build the app and serve it until SIGINT/SIGTERM (exit 0)."""
    require_serve_packages()
    from vitkit.cores import choose_threads
    from vitkit.serve.app import create_app
    from vitkit.serve.batching import default_max_queue
    from vitkit.serve.server import Limits, serve
    from vitkit.serve.service import ModelService

    token = resolve_token(args)
    check_port_free(args.host, args.port)  # before the model loads
    choose_threads(args.threads, what="serving", pin="--threads {n}")
    service = ModelService.load(args.weights, weights_dir=args.weights_dir,
                                batch_size=args.max_batch, options=inference_options(args))
    app = create_app(service, max_batch=args.max_batch, max_wait_ms=args.max_wait_ms,
                     token=token, max_upload_mb=args.max_upload_mb,
                     max_pixels=args.max_pixels,
                     max_queue=args.max_queue or default_max_queue(args.max_batch))
    shown = f"[{args.host}]" if ":" in args.host else args.host
    tta = ", flip TTA" if service.tta == "flip" else ""
    print(f"vitkit serve: {service.name} ({service.task.kind}, {service.precision_name}{tta}) at "
          f"http://{shown}:{args.port}/ (Ctrl-C to stop)", flush=True)
    limits = Limits(read_timeout=args.read_timeout, keep_alive=args.keep_alive,
                    max_connections=args.max_connections, shutdown_grace=args.shutdown_grace)
    return 0 if serve(app, args.host, args.port, limits) else 1
