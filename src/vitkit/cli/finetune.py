"""`vitkit finetune WEIGHTS [KEY=VALUE ...]`: the finetune recipe started from pretrained
weights (`vitkit.train.recipe.finetune_config`), trained as `train` trains."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.arguments import add_weights_argument, parse_img_size
from vitkit.cli.train import add_run_arguments, run_training


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("finetune", help="fine-tune pretrained weights (the paper's "
                                               "recipe: SGD, new head, higher resolution)")
    add_weights_argument(parser)
    add_run_arguments(parser, "finetune recipe", "lr=0.01 total_steps=500")
    parser.add_argument("--data", help="digits, cifar10, cifar100, folder or hf:NAME_OR_PATH "
                        "(default: the data a vitkit run recorded, else cifar10)")
    parser.add_argument("--img-size", type=parse_img_size, help="fine-tuning resolution "
                                                                "(default: 384 for weights "
                                                                "pretrained at 224, else "
                                                                "their own size)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    """The finetune recipe started from WEIGHTS; flags become overrides, as in `train`."""
    from vitkit.train.recipe import finetune_config

    cfg = finetune_config(args.weights, args.overrides, data=args.data, img_size=args.img_size,
                          weights_dir=args.weights_dir, resume=args.resume, out=args.out,
                          time_budget=args.time_budget, data_dir=args.data_dir)
    return run_training(cfg, args)
