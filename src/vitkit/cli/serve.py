"""`vitkit serve WEIGHTS`: the web app's verb. Its flags and command live with the app
(`vitkit.serve.command`, argparse only at import: FastAPI, uvicorn and the model load when it
runs); this module hands them to the parser as every verb module does."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.serve.command import add_serve_verb, cmd_serve


def add_parser(verbs: Any) -> None:
    add_serve_verb(verbs).set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Serve until SIGINT/SIGTERM (exit 0; 1 when the server did not start)."""
    return cmd_serve(args)
