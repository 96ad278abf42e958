"""`vitkit train [RECIPE] [KEY=VALUE ...]`: a run from a recipe (`vitkit.train.recipe.run_config`)
trained by `vitkit.train.loop.train`. Also what `finetune` shares with it: the run flags and
how a run's end is printed."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from vitkit.train.config import TrainConfig


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("train", help="train from scratch (default: the embedded digits)")
    parser.add_argument("recipe", nargs="?", default=None,
                        help="recipe JSON file or shipped recipe name (digits, cifar10, ...); "
                             "default: digits; with data=... another source, TrainConfig's "
                             "defaults; with --resume the checkpoint's recipe")
    add_run_arguments(parser, "recipe", "epochs=5 model.depth=4 augment.flip=false")
    parser.add_argument("--data", help="the data to train on, as data=... sets it: digits, "
                                       "cifar10, cifar100, folder, arrays or hf:NAME_OR_PATH")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """Train; exit 128 + the signal number when SIGINT/SIGTERM stopped the run (130, 143),
    so a stopped run does not look finished."""
    from vitkit.train.recipe import run_config

    cfg = run_config(args.recipe, args.overrides, resume=args.resume, out=args.out,
                     time_budget=args.time_budget, data=args.data, data_dir=args.data_dir)
    return run_training(cfg, args)


def add_run_arguments(parser: argparse.ArgumentParser, recipe: str, example: str) -> None:
    """The arguments `train` and `finetune` share: overrides, resume, budget, output, data."""
    parser.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                        help=f"{recipe} overrides, e.g. {example}")
    parser.add_argument("--resume", help="continue from a run folder (its last.pt) or a "
                        "checkpoint file, in its folder "
                        "unless --out says otherwise: exactly with the same settings (without a "
                        "recipe, the checkpoint's own); a new epochs=/total_steps=/--time-budget "
                        "re-plans the run (extends a finished one)")
    parser.add_argument("--overwrite", action="store_true",
                        help="start over in an --out folder that holds a run (deletes its "
                        "checkpoints and metrics)")
    parser.add_argument("--time-budget", type=float, metavar="SECONDS",
                        help="size the schedule to this much training time and stop cleanly")
    parser.add_argument("--out", help=f"output folder (default: the {recipe}'s out_dir)")
    parser.add_argument("--data-dir", help="local dataset folder (CIFAR binary, image folders)")


def run_training(cfg: TrainConfig, args: argparse.Namespace) -> int:
    """Train `cfg` (--resume, --overwrite) and print how it ended (on the main process)."""
    from vitkit.train.loop import train

    result = train(cfg, resume=args.resume, overwrite=args.overwrite)
    if result.is_main:
        print(result.format())
    return result.exit_status
