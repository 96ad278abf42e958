"""`vitkit predict WEIGHTS INPUT...`: the predictions of image and array files
(`vitkit.predict.predict_files`), then how it went (`Predictions.outcome`): exit 0 when every
input was predicted, 1 when some could not be read (named on stderr after the others'
predictions), 2 when none could."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from vitkit.arguments import add_inference_arguments, add_weights_argument, inference_options
from vitkit.cli.output import print_report


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("predict", help="top-k classes (or the task's values or labels) "
                                              "of images with a checkpoint")
    add_weights_argument(parser)
    parser.add_argument("inputs", nargs="*", metavar="INPUT",
                        help="image files, folders (searched recursively for images) or "
                             ".npy/.npz array files (one prediction per array image)")
    parser.add_argument("--sample", action="store_true", help="also predict the shipped "
                        "sample digit (a 3, light strokes on black, 8x8; its path is printed)")
    parser.add_argument("--topk", type=int, default=5, help="classes per image (default 5)")
    parser.add_argument("--json", action="store_true", help="one JSON object per line")
    parser.add_argument("--batch-size", type=int, default=32)
    add_inference_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from vitkit.predict import predict_files

    report = predict_files(args.weights, args.inputs, args.topk, args.batch_size,
                           args.weights_dir, sample=args.sample,
                           options=inference_options(args))
    print_report(report, args.json)
    status, message = report.outcome()  # raises InputError when no input could be read
    if message:
        print(f"vitkit predict: {message}", file=sys.stderr)
    return status
