"""`vitkit models [--checkpoints]`: the catalog's tables (`vitkit.catalog.models_report`)."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.cli.output import print_report


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("models", help="list model names with their sizes")
    parser.add_argument("--checkpoints", action="store_true",
                        help="list every named checkpoint with its URL and ImageNet top-1")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from vitkit.catalog import models_report

    print_report(models_report(checkpoints=args.checkpoints))
