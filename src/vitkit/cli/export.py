"""`vitkit export WEIGHTS`: an ONNX graph (float or int8, with token merging when asked),
written and checked with onnxruntime (`vitkit.inference.speedup.export_merged`)."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.arguments import add_int8_arguments, add_merge_tokens_argument, add_weights_argument
from vitkit.cli.output import print_report


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("export", help="write ONNX (dynamic batch) and check it with "
                                             "onnxruntime")
    add_weights_argument(parser)
    parser.add_argument("--format", default="onnx", help="output format (only onnx)")
    parser.add_argument("--out", help="output file (default: beside the weights, .onnx; a "
                                      "folder is refused, naming a file in it)")
    parser.add_argument("--dynamic-size", action="store_true",
                        help="also accept other image sizes (multiples of the patch size)")
    parser.add_argument("--opset", type=int, help="ONNX opset (default: torch's)")
    add_int8_arguments(parser, "the ONNX graph, with onnxruntime's quantize_dynamic (int8 "
                       "MatMul/Gemm weights), checked against the float model; default "
                       "output .int8.onnx", eager=False)
    add_merge_tokens_argument(parser, "; in the graph, at the model's image size (not with "
                                      "--dynamic-size); default output .mergeR.onnx")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from vitkit.inference.speedup import export_merged

    print_report(export_merged(args.weights, args.out, merge_tokens=args.merge_tokens,
                               format=args.format, int8=args.int8,
                               dynamic_size=args.dynamic_size, opset=args.opset,
                               weights_dir=args.weights_dir))
