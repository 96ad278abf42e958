"""`vitkit fewshot WEIGHTS [MORE_WEIGHTS...]`: few-shot linear evaluation of frozen features
(`vitkit.evaluation.fewshot_report`). Also the flags it shares with `probe` (the features are
cached between the two)."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.arguments import (
    add_weights_argument,
    non_negative_float,
    output_file,
    output_folder,
    positive_int,
)
from vitkit.cli.output import print_report


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("fewshot", help="few-shot linear evaluation of frozen features "
                                              "(the paper's, big_vision's ridge regression)")
    add_frozen_feature_arguments(parser)
    parser.add_argument("--shots", type=parse_shots, default=(1, 5, 10, 25),
                        help="images per class, comma-separated (default 1,5,10,25)")
    parser.add_argument("--seeds", type=positive_int, default=3,
                        help="draws of the training images per shot count (default 3)")
    parser.add_argument("--l2", type=non_negative_float, default=1024.0,
                        help="ridge regularisation (default 1024 = 2^10, big_vision's)")
    parser.add_argument("compare", nargs="*", metavar="MORE_WEIGHTS",
                        help="more weights to compare on the same data, shots and seeds "
                             "(one curve each in fewshot.png)")
    parser.add_argument("--out", type=output_folder,
                        help="folder for fewshot.png (default: beside the first "
                             "weights, as for `vitkit eval`: in a run or model "
                             "folder; ./eval for a checkpoint name or hf-hub: "
                             "repository)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from vitkit.cores import choose_threads
    from vitkit.evaluation import fewshot_report

    choose_threads(what="extracting features")
    weights = [args.weights, *args.compare]
    print_report(fewshot_report(weights, args.data, args.data_dir, args.shots, args.seeds,
                                args.l2, args.json, args.out, args.weights_dir))


def add_frozen_feature_arguments(parser: argparse.ArgumentParser) -> None:
    """What `fewshot` and `probe` both take: the weights, their data and a JSON file."""
    add_weights_argument(parser)
    parser.add_argument("--data", help="digits, cifar10, cifar100, folder or hf:NAME_OR_PATH "
                                       "(default: the data a training checkpoint records)")
    parser.add_argument("--data-dir", help="local dataset folder")
    parser.add_argument("--json", metavar="FILE", type=output_file("report.json"),
                        help="also write the results as JSON")


def parse_shots(text: str) -> tuple[int, ...]:
    """"1,5,10,25" -> (1, 5, 10, 25)."""
    return tuple(positive_int(part) for part in text.split(",") if part.strip())
