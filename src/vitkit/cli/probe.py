"""`vitkit probe WEIGHTS`: a linear probe and kNN of frozen features
(`vitkit.evaluation.probe_report`), with the flags `fewshot` takes too."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.arguments import positive_float, positive_int
from vitkit.cli.fewshot import add_frozen_feature_arguments
from vitkit.cli.output import print_report


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("probe", help="linear probe (logistic regression; ridge R^2 for "
                                            "regression models) and kNN of frozen features")
    add_frozen_feature_arguments(parser)
    parser.add_argument("--k", type=positive_int, default=20, help="kNN neighbours (default 20)")
    parser.add_argument("--temperature", type=positive_float, default=0.07,
                        help="kNN vote temperature (default 0.07, DINO's)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from vitkit.cores import choose_threads
    from vitkit.evaluation import probe_report

    choose_threads(what="extracting features")
    print_report(probe_report(args.weights, args.data, args.data_dir, args.k,
                              args.temperature, args.json, args.weights_dir))
