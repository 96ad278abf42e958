"""`vitkit benchmark [MODEL_OR_WEIGHTS]`: one inference benchmark, or with --sweep the variants x
resolutions table and figure (`vitkit.inference.benchmark.results.benchmark_report`)."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.arguments import (
    add_int8_arguments,
    add_merge_tokens_argument,
    add_precision_argument,
    int8_engine,
    non_negative_int,
    output_file,
    parse_img_size,
    positive_float,
    positive_int,
)
from vitkit.cli.output import print_report

# What a figure --out may replace: matplotlib's formats, and a name without a suffix (which
# gets .png added, so it is not written over).
FIGURE_SUFFIXES = ("", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps", ".tif",
                   ".tiff", ".webp", ".pgf", ".raw", ".rgba")


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("benchmark", help="inference images/s, latency, peak memory, "
                                                "FLOPs and MFU (--sweep: Figure 12)")
    parser.add_argument("model", nargs="?", metavar="MODEL_OR_WEIGHTS",
                        help="variant ('B/16', 'cifar10-tutorial', ...: random weights) or "
                             "weights file, folder, run folder or hf-hub:ORG/NAME")
    parser.add_argument("--img-size", type=parse_img_size,
                        help="image size (default: the model's; positions resampled)")
    parser.add_argument("--batch-size", type=positive_int, default=8,
                        help="batch of the images/s measurement (default 8)")
    add_int8_arguments(parser, "--engine torch: the engine --int8-engine names (default "
                               "auto: the fastest measured of torch's, oneDNN's and ONNX "
                               "Runtime's; vitkit.inference.quantize.quantize_int8); --engine "
                               "onnxruntime: the exported graph's (onnxruntime "
                               "quantize_dynamic)")
    add_precision_argument(parser)
    add_merge_tokens_argument(parser)
    parser.add_argument("--engine", default="torch", choices=("torch", "onnxruntime"),
                        help="torch (default) or onnxruntime (exported with vitkit export)")
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile the model with its weights frozen (inductor "
                             "freezing); the compile time is reported apart")
    parser.add_argument("--threads", type=positive_int,
                        help="intra-op threads (default: torch's)")
    parser.add_argument("--warmup", type=non_negative_int, default=3,
                        help="untimed calls after the first (default 3)")
    parser.add_argument("--iters", type=positive_int, default=10,
                        help="timed calls; medians are reported (default 10)")
    parser.add_argument("--json", action="store_true",
                        help="one JSON object (per sweep row) instead of the table")
    parser.add_argument("--weights-dir", help="folder for downloaded named checkpoints")
    parser.add_argument("--sweep", action="store_true",
                        help="variants x resolutions (the paper's Figure 12): images/s and "
                             "the largest batch that fits --memory-gb")
    parser.add_argument("--variants", help="sweep variants, comma-separated (default "
                                           "Ti/16,S/16,B/16,B/32,L/16)")
    parser.add_argument("--resolutions",
                        help="sweep resolutions, comma-separated (default 224,384)")
    parser.add_argument("--memory-gb", type=positive_float,
                        help="sweep memory cap (default: 0.8 x the available memory)")
    parser.add_argument("--out", type=output_file("sweep.png", FIGURE_SUFFIXES),
                        help="sweep figure (PNG, or another format by its suffix: pdf, svg, "
                             "...; .png is added to a name without one; default "
                             "benchmark_sweep.png)")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    """One benchmark, or with --sweep the variants x resolutions table and figure."""
    from vitkit.cores import choose_threads
    from vitkit.inference.benchmark import EngineOptions
    from vitkit.inference.benchmark.results import benchmark_report

    # the report names the count used
    choose_threads(args.threads, what="benchmarking", pin="--threads {n}")
    engine = int8_engine(args)
    options = EngineOptions(args.engine, args.compile, engine is not None, args.merge_tokens,
                            args.threads, args.int8_engine, args.precision)
    print_report(benchmark_report(args.model, args.img_size, args.batch_size, options,
                                  args.warmup, args.iters, args.weights_dir,
                                  sweep_table=args.sweep, variants=args.variants,
                                  resolutions=args.resolutions, memory_gb=args.memory_gb,
                                  out=args.out), args.json)
