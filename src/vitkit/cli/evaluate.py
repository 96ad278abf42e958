"""`vitkit eval WEIGHTS`: the evaluation report of a checkpoint on its data
(`vitkit.evaluation.evaluate_weights.evaluate_checkpoint`)."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.arguments import (
    add_inference_arguments,
    add_weights_argument,
    image_count,
    inference_options,
    output_folder,
    positive_int,
)
from vitkit.cli.output import print_report


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("eval", help="top-1/top-5, per-class accuracy, confusion PNG")
    add_weights_argument(parser)
    parser.add_argument("--data", default=None,
                        help="digits, cifar10, cifar100, folder or hf:NAME_OR_PATH (default: "
                             "the data a training checkpoint records; required for other "
                             "weights)")
    parser.add_argument("--data-dir", help="local dataset folder")
    parser.add_argument("--split",
                        help="train, test (the held-out split: a folder's val/ or test/, or "
                             "its class sub-folders when it has no train/; val names it "
                             "too; a Hugging Face dataset's split named test where it has "
                             "one), or "
                             "any split name of a Hugging Face dataset (default: the "
                             "held-out split: the one the run evaluated on, for a Hugging "
                             "Face dataset validation before test)")
    parser.add_argument("--limit", type=image_count,
                        help="evaluate only the first N images, or all (default: as the "
                             "training run did, its test_limit)")
    parser.add_argument("--batch-size", type=positive_int, default=500)
    parser.add_argument("--out", type=output_folder,
                        help="folder for the report and confusion_matrix.png "
                             "(default: beside the weights; ./eval for a "
                             "checkpoint name or hf-hub: repository). Each "
                             "evaluation keeps eval-DATA-SPLIT.json (-int8, -bf16, "
                             "-mergeR, -flip for those paths; DATA-FOLDER with "
                             "--data-dir); eval.json is the latest")
    add_inference_arguments(parser)
    parser.add_argument("--json", action="store_true", help="print the report as one JSON "
                                                            "object (what eval.json holds)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from vitkit.cores import choose_threads
    from vitkit.evaluation.evaluate_weights import evaluate_checkpoint

    choose_threads(what="evaluating")

    print_report(evaluate_checkpoint(args.weights, args.data, args.data_dir, args.split,
                                     args.out, args.limit, args.batch_size, args.weights_dir,
                                     options=inference_options(args)), args.json)
