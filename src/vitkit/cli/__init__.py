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
import difflib
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


# How close (difflib's ratio) a mistyped verb or flag must be to one to be suggested: "trian"
# finds train and "--ouput" --out, while "--limt" is not taken for --int8; of several, those
# nearly as close as the closest (`--limt`: --limit, not --split too).
CLOSE_ENOUGH = 0.6
NEARLY_AS_CLOSE = 0.1


class Parser(argparse.ArgumentParser):
    """argparse without abbreviated options, so a misspelt flag is refused rather than read as
    the one option it begins (`--data` as `--data-dir`); a verb that is none is refused naming
    the closest verbs (`unknown_verb_message`), not with the list of every choice."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)

    def _check_value(self, action: argparse.Action, value: Any) -> None:
        # argparse checks every choice here, the verb (a subparsers action's choice) included
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            self.error(unknown_verb_message(value, list(action.choices)))
        super()._check_value(action, value)


def closest(word: str, choices: list[str]) -> list[str]:
    """The choices closest to `word`, closest first: none below CLOSE_ENOUGH, and only those
    nearly as close as the closest."""
    ratios = {choice: difflib.SequenceMatcher(None, word, choice).ratio()
              for choice in difflib.get_close_matches(word, choices, n=3, cutoff=CLOSE_ENOUGH)}
    best = max(ratios.values(), default=0.0)
    return [choice for choice, ratio in ratios.items() if ratio >= best - NEARLY_AS_CLOSE]


def unknown_verb_message(word: str, verbs: list[str]) -> str:
    """"'trian' is not a command. Did you mean 'train'?", or the verbs when none is close."""
    close = closest(word, verbs)
    if close:
        return f"{word!r} is not a command. Did you mean {' or '.join(map(repr, close))}?"
    return (f"{word!r} is not a command; the commands are {', '.join(verbs)} (vitkit --help "
            "says what each does)")


def long_options(parser: argparse.ArgumentParser) -> list[str]:
    """The --flags of `parser` but --help, in its order."""
    return [option for action in parser._actions for option in action.option_strings
            if option.startswith("--") and option != "--help"]


def as_option(flag: str) -> str:
    """How `flag` ("--time_budget=60", "-out") would be spelt as an option: "--time-budget"."""
    return "--" + flag.partition("=")[0].lstrip("-").replace("_", "-")


def unknown_flags_message(parser: argparse.ArgumentParser, flags: list[str]) -> str:
    """"--ouput is not an option of vitkit train. Did you mean --out?" for each of `flags`
    (`--name` or `--name=value`), or the verb's options when none is close to one."""
    options = long_options(parser)
    said = []
    for flag in flags:
        name = flag.partition("=")[0]
        close = closest(as_option(flag)[2:], [option[2:] for option in options])
        if close:
            said.append(f"{name} is not an option of {parser.prog}. Did you mean "
                        f"{' or '.join('--' + option for option in close)}?")
        else:
            listed = (f"its options are {', '.join(options)}" if options
                      else "it takes no options")
            said.append(f"{name} is not an option of {parser.prog}; {listed} ({parser.prog} "
                        "--help says what each does)")
    return " ".join(said)


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
    level's); `train --epochs 3` is told that settings are KEY=VALUE, and another unknown flag
    is told the verb's closest flags (`unknown_flags_message`)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    args, extra = parser.parse_known_args(argv)
    overrides = [item for item in extra if "=" in item and not item.startswith("-")]
    if extra and (len(overrides) < len(extra) or not hasattr(args, "overrides")):
        verb_parser = getattr(args, "verb_parser", parser)
        flags = [item for item in extra if item.startswith("-")]
        respelt = any(as_option(flag) in long_options(verb_parser) for flag in flags)
        if hasattr(args, "overrides") and not respelt:  # --time_budget: told --time-budget
            hint = setting_flag_hint(extra, argv)
            if hint:
                verb_parser.error(hint)
        said = unknown_flags_message(verb_parser, flags) if flags else " ".join(extra)
        verb_parser.error(f"unrecognized arguments: {said}")
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
