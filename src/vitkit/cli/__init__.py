"""`vitkit <verb>`: a thin command-line layer over the library.

This module is the core every verb shares: `main` (parse, set up logging, run the verb, turn
its errors into exit statuses) and `build_parser`, which asks each verb module for its
subparser. Each verb is a module of this package: `add_parser(verbs)` declares its flags and
help, `run(args)` makes one library call and prints its report, returning the exit status.
Building the parser imports no library code (`vitkit --help` stays fast): a verb imports what
it runs inside `run`.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import Any

from vitkit.errors import VitkitError, lost_peer_message, out_of_memory_message
from vitkit.version import __version__

__all__ = ["EXIT_BUG", "EXIT_ERROR", "EXIT_INTERRUPTED", "Parser", "build_parser",
           "configure_logging", "main", "parse_arguments"]

# `vitkit --help`'s description: what the exit statuses mean. A verb returns its own (1 from
# `predict` when some inputs failed: `vitkit.predict.Predictions.outcome`); the others are set here.
DESCRIPTION = """`vitkit <verb>`: a thin command-line layer over the library.

Exit status: 0 on success; 1 when some inputs failed but the rest were done (`predict`);
2 for a usage error or a `VitkitError` (one line on stderr, no traceback); 130 for Ctrl-C
(one line; training saves a checkpoint first). Anything else is a bug: its traceback is kept
and the user is asked to report it.
"""
EXIT_BUG = 1  # an unexpected exception (as Python's own exit status for one)
EXIT_ERROR = 2  # a usage error or a VitkitError
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as the shell reports it
# Libraries whose loggers print through a handler of their own: the root handler must not print
# their messages a second time.
OWN_HANDLER_LOGGERS = ("huggingface_hub", "datasets")
BUG_REPORT = ("vitkit {verb}: this is a bug in vitkit, not a problem with your input: please "
              "report this bug with the command you ran and the traceback above.")


class Parser(argparse.ArgumentParser):
    """argparse without abbreviated options, so a misspelt flag is refused rather than read as
    the one option it begins (`--data` as `--data-dir`)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with each verb's subparser, in `vitkit --help`'s order."""
    from vitkit.cli import (
        benchmark,
        evaluate,
        explain,
        export,
        fewshot,
        finetune,
        models,
        predict,
        probe,
        serve,
        summary,
        train,
    )

    parser = Parser(prog="vitkit", description=DESCRIPTION)
    parser.add_argument("--version", action="version", version=f"vitkit {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")
    for verb in (models, summary, train, finetune, evaluate, predict, export, explain,
                 benchmark, fewshot, probe, serve):
        verb.add_parser(verbs)
    for verb_parser in verbs.choices.values():  # unknown flags get the verb's usage
        verb_parser.set_defaults(verb_parser=verb_parser)
    return parser


def parse_arguments(parser: argparse.ArgumentParser, argv: Sequence[str] | None
                    ) -> argparse.Namespace:
    """Parse, letting KEY=VALUE overrides come after --flags too (`train --out x epochs=3`).
    An unrecognised argument is refused by the verb's own parser (its usage, not the top
    level's); `train --epochs 3` is told that settings are KEY=VALUE."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    overrides = [item for item in extra if "=" in item and not item.startswith("-")]
    if extra and (len(overrides) < len(extra) or not hasattr(args, "overrides")):
        verb_parser = getattr(args, "verb_parser", parser)
        if hasattr(args, "overrides"):
            hint = setting_flag_hint(extra, argv)
            if hint:
                verb_parser.error(hint)
        verb_parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if overrides:
        args.overrides = [*args.overrides, *overrides]
    return args


def setting_flag_hint(extra: list[str], argv: list[str]) -> str | None:
    """"unrecognized argument --epochs: training settings are KEY=VALUE, e.g. epochs=3" for
    the first --FLAG in `extra` that names a training setting; None when none does."""
    from vitkit.train.recipe import is_setting_key, setting_example

    for flag in (item for item in extra if item.startswith("--")):
        name, equals, value = flag[2:].partition("=")
        key = name.replace("-", "_")
        if not is_setting_key(key):
            continue
        if not equals:
            position = argv.index(flag) + 1
            following = argv[position] if position < len(argv) else ""
            value = following if following and not following.startswith("-") \
                and "=" not in following else None
        return (f"unrecognized argument {flag.partition('=')[0]}: training settings are "
                f"KEY=VALUE, e.g. {setting_example(key, value)}")
    return None


def configure_logging() -> None:
    """vitkit's own messages at INFO (what was loaded, and how), other libraries' warnings,
    each message printed once (Hugging Face's libraries print theirs with their own handler).
    Under torchrun, rank 0 speaks for all: the other processes log errors only, so a run's
    notes and warnings are not repeated once per process."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    main_process = os.environ.get("RANK", "0") == "0"
    logging.getLogger("vitkit").setLevel(logging.INFO if main_process else logging.ERROR)
    for name in OWN_HANDLER_LOGGERS:
        logging.getLogger(name).propagate = False


def main(argv: Sequence[str] | None = None) -> int:
    """`vitkit VERB ...`: the verb's exit status (see DESCRIPTION)."""
    args = parse_arguments(build_parser(), argv)
    configure_logging()
    try:
        return args.run(args) or 0
    except VitkitError as exc:  # bad input: the message says what to change
        print(f"vitkit {args.verb}: error: {exc}", file=sys.stderr)
        return EXIT_ERROR
    except KeyboardInterrupt:  # Ctrl-C outside training (which saves and stops on its own)
        print(f"vitkit {args.verb}: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:  # the reader went away (`vitkit models | head`): not an error
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no flush error at exit
        return 0
    except (MemoryError, RuntimeError) as exc:  # out of memory: the input asked too much
        message = out_of_memory_message(exc) or lost_peer_message(exc)
        if message is None:
            traceback.print_exc()
            print(BUG_REPORT.format(verb=args.verb), file=sys.stderr)
            return EXIT_BUG
        print(f"vitkit {args.verb}: error: {message}", file=sys.stderr)
        return EXIT_ERROR
    except Exception:  # anything else is a bug in vitkit: keep the traceback for the report
        traceback.print_exc()
        print(BUG_REPORT.format(verb=args.verb), file=sys.stderr)
        return EXIT_BUG
