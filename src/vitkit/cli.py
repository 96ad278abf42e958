"""`vitkit <verb>`: a thin command-line layer over the library.

Exit status: 0 on success; 1 when some inputs failed but the rest were done (`predict`);
2 for a usage error or a `VitkitError` (one line on stderr, no traceback); 130 for Ctrl-C
(one line; training saves a checkpoint first). Anything else is a bug: its traceback is kept
and the user is asked to report it.
"""

from __future__ import annotations

import argparse
import functools
import logging
import os
import sys
import traceback
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from vitkit.arguments import (
    add_inference_arguments,
    add_int8_arguments,
    add_merge_tokens_argument,
    add_precision_argument,
    add_weights_argument,
    fraction_below_one,
    image_count,
    int8_engine,
    non_negative_float,
    non_negative_int,
    output_file,
    output_folder,
    parse_img_size,
    positive_float,
    positive_int,
)
from vitkit.config import SIZES, ViTConfig
from vitkit.errors import VitkitError, lost_peer_message, out_of_memory_message
from vitkit.fieldtypes import parse_text
from vitkit.version import __version__

if TYPE_CHECKING:
    from vitkit.report import Formats
    from vitkit.train.config import TrainConfig
    from vitkit.weights.formats.hub import NamedCheckpoint

EXIT_PARTIAL = 1  # some inputs failed, the others were done
EXIT_BUG = 1  # an unexpected exception (as Python's own exit status for one)
EXIT_ERROR = 2  # a usage error or a VitkitError
EXIT_INTERRUPTED = 130  # Ctrl-C (128 + SIGINT), as the shell reports it
# What a figure --out may replace: matplotlib's formats, and a name without a suffix (which
# gets .png added, so it is not written over).
FIGURE_SUFFIXES = ("", ".pdf", ".svg", ".svgz", ".jpg", ".jpeg", ".eps", ".ps", ".tif",
                   ".tiff", ".webp", ".pgf", ".raw", ".rgba")
# Libraries whose loggers print through a handler of their own: the root handler must not print
# their messages a second time.
OWN_HANDLER_LOGGERS = ("huggingface_hub", "datasets")
BUG_REPORT = ("vitkit {verb}: this is a bug in vitkit, not a problem with your input: please "
              "report this bug with the command you ran and the traceback above.")


def parse_override(text: str) -> tuple[str, str]:
    """"key=value" -> (key, value text); the value is typed later by the field it sets."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"override {text!r} is not KEY=VALUE")
    key, value = text.split("=", 1)
    return key.strip(), value


def model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """--set KEY=VALUE (or model.KEY=VALUE, as in `train`) and the size flags, typed by the
    ViTConfig field each one sets."""
    overrides = {}
    for key, text in args.set or []:
        name = key.removeprefix("model.")
        overrides[name] = parse_text(ViTConfig, name, text, label=key)
    for key in ("img_size", "num_classes", "in_chans", "patch_size"):
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)
    return overrides


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="variant ('B/16', 'S/32', ...), tutorial model name, "
                                      "JSON config file, checkpoint file, folder or run folder, "
                                      "named checkpoint ('R50+B/16-i21k'; `vitkit models "
                                      "--checkpoints` lists them) or Hub repository "
                                      "(hf-hub:ORG/NAME[@REVISION])")
    parser.add_argument("--img-size", type=parse_img_size, help="224, or HxW like 60x100")
    parser.add_argument("--num-classes", type=int, help="classifier outputs (0: features only)")
    parser.add_argument("--in-chans", type=int, help="input channels")
    parser.add_argument("--patch-size", type=int, help="patch size P")
    parser.add_argument("--set", type=parse_override, action="append", metavar="KEY=VALUE",
                        help="any other config field, e.g. --set pool=mean_patches")


def print_report(report: Formats, as_json: bool = False) -> None:
    """A verb's report: its text, or its JSON lines (`--json` where the verb prints JSON)."""
    text = report.json_lines() if as_json else report.format()
    if text:
        print(text)


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


def cmd_models(args: argparse.Namespace) -> None:
    from vitkit.catalog import checkpoint_rows, model_rows
    from vitkit.files import cache_root

    if args.checkpoints:
        print_checkpoint_table(checkpoint_rows())
        return
    print(f"{'name':<18}{'layers':>7}{'width':>7}{'MLP':>7}{'heads':>7}{'image':>9}"
          f"{'params':>15}")
    for model in model_rows():
        cfg = model.config
        image = f"{cfg.img_size[0]}" if cfg.img_size[0] == cfg.img_size[1] else \
            f"{cfg.img_size[0]}x{cfg.img_size[1]}"
        print(f"{model.name:<18}{cfg.depth:>7}{cfg.width:>7}{cfg.mlp_dim:>7}{cfg.num_heads:>7}"
              f"{image:>9}{model.params:>15,}")
    sizes = "/".join(SIZES)
    print(f"\nAny size {sizes} with any patch size parses too (e.g. 'L/8', 'Ti/4'); "
          "change anything with keyword overrides.")
    rows = checkpoint_rows()
    original = [row for row in rows if not row.augreg]
    print("\nNamed official checkpoints (load_pretrained(NAME), or NAME wherever a command takes "
          f"weights; cached in {cache_root()}, or put the file in --weights-dir):")
    for row in original:
        print(f"  {row.name:<24}{row.url}")
    print(f"  ... and {len(rows) - len(original)} AugReg checkpoints (e.g. "
          "B/16-augreg-i21k-i1k-384): `vitkit models --checkpoints` lists every name with its "
          "URL and ImageNet top-1.\nHub repositories load as hf-hub:ORG/NAME "
          "(e.g. hf-hub:google/vit-base-patch16-224).")


def print_checkpoint_table(rows: list[NamedCheckpoint]) -> None:
    """`vitkit models --checkpoints`: name, expected ImageNet top-1, URL."""
    width = max(len(row.name) for row in rows) + 2
    print(f"{'name':<{width}}{'top-1 %':>8}  {'source':<11}url")
    for row in rows:
        top1 = f"{row.top1:.2f}" if row.top1 is not None else "-"
        print(f"{row.name:<{width}}{top1:>8}  {row.top1_source or '-':<11}{row.url}")
    print("\ntop-1: ImageNet-2012 validation; 'timm' = timm's results-imagenet.csv (its own "
          "evaluation of the same weights), 'vit README' = the official README's expected "
          "figure; '-' = no published figure. i21k checkpoints have a 21,843-way ImageNet-21k "
          "head.")


def cmd_summary(args: argparse.Namespace) -> None:
    from vitkit.summary import summarize

    print(summarize(args.model, max_depth=args.max_depth, **model_overrides(args)).format())


def cmd_train(args: argparse.Namespace) -> int:
    """Train; exit 128 + the signal number when SIGINT/SIGTERM stopped the run (130, 143),
    so a stopped run does not look finished."""
    from vitkit.train.recipe import run_config

    cfg = run_config(args.recipe, args.overrides, resume=args.resume, out=args.out,
                     time_budget=args.time_budget, data=args.data, data_dir=args.data_dir)
    return run_training(cfg, args)


def run_training(cfg: TrainConfig, args: argparse.Namespace) -> int:
    """Train `cfg` (--resume, --overwrite) and print how it ended."""
    from vitkit.train.loop import train

    result = train(cfg, resume=args.resume, overwrite=args.overwrite)
    if result.is_main:
        print(result.format())
    return result.exit_status


def cmd_finetune(args: argparse.Namespace) -> int:
    """The finetune recipe started from WEIGHTS; flags become overrides, as in `train`."""
    from vitkit.train.recipe import finetune_config

    cfg = finetune_config(args.weights, args.overrides, data=args.data, img_size=args.img_size,
                          weights_dir=args.weights_dir, resume=args.resume, out=args.out,
                          time_budget=args.time_budget, data_dir=args.data_dir)
    return run_training(cfg, args)


def cmd_eval(args: argparse.Namespace) -> None:
    from vitkit.evaluation.report import evaluate_checkpoint

    print_report(evaluate_checkpoint(args.weights, args.data, args.data_dir, args.split,
                                     args.out, args.limit, args.batch_size, args.weights_dir,
                                     args.merge_tokens, int8_engine(args), args.precision,
                                     args.tta), args.json)


def cmd_predict(args: argparse.Namespace) -> int:
    """Exit 0 when every input was predicted, 1 when some could not be read (named on
    stderr after the others' predictions), 2 when none could."""
    from vitkit.data.sources.digits import sample_digit
    from vitkit.errors import InputError
    from vitkit.predict import predict_files

    inputs = [*args.inputs, *([sample_digit()] if args.sample else [])]
    report = predict_files(args.weights, inputs, args.topk, args.batch_size,
                           args.weights_dir, args.merge_tokens, int8_engine(args),
                           args.precision, args.tta)
    print_report(report, args.json)
    failed, total = report.failed, len(report.results)
    if len(failed) == total:
        raise InputError(report.none_read_message())
    if failed:
        print(f"vitkit predict: {len(failed)} of {total} files could not be read: "
              + ", ".join(failed), file=sys.stderr)
        return EXIT_PARTIAL
    return 0


def cmd_export(args: argparse.Namespace) -> None:
    from vitkit.export import export_weights
    from vitkit.inference import speed_up

    merging = functools.partial(speed_up, merge_tokens=args.merge_tokens) \
        if args.merge_tokens else None
    print_report(export_weights(args.weights, args.out, format=args.format, int8=args.int8,
                                dynamic_size=args.dynamic_size, opset=args.opset,
                                weights_dir=args.weights_dir, prepare=merging))


def cmd_explain(args: argparse.Namespace) -> None:
    from vitkit.analysis.explain import explain_report

    print_report(explain_report(args.weights, args.images, args.out, args.data, args.data_dir,
                                args.num_images, args.weights_dir, args.seed,
                                head_fusion=args.head_fusion, discard_ratio=args.discard_ratio,
                                show=args.show))


def cmd_benchmark(args: argparse.Namespace) -> None:
    """One benchmark, or with --sweep the variants x resolutions table and figure."""
    from vitkit.inference.benchmark import EngineOptions
    from vitkit.inference.benchmark.report import benchmark_report

    engine = int8_engine(args)
    options = EngineOptions(args.engine, args.compile, engine is not None, args.merge_tokens,
                            args.threads, args.int8_engine, args.precision)
    print_report(benchmark_report(args.model, args.img_size, args.batch_size, options,
                                  args.warmup, args.iters, args.weights_dir,
                                  sweep_table=args.sweep, variants=args.variants,
                                  resolutions=args.resolutions, memory_gb=args.memory_gb,
                                  out=args.out), args.json)


# -- frozen-feature evaluation (issue 12): `vitkit fewshot`, `vitkit probe` -------------------
def parse_shots(text: str) -> tuple[int, ...]:
    """"1,5,10,25" -> (1, 5, 10, 25)."""
    return tuple(positive_int(part) for part in text.split(",") if part.strip())


def cmd_fewshot(args: argparse.Namespace) -> None:
    from vitkit.evaluation import fewshot_report

    weights = [args.weights, *args.compare]
    print_report(fewshot_report(weights, args.data, args.data_dir, args.shots, args.seeds,
                                args.l2, args.json, args.out, args.weights_dir))


def cmd_probe(args: argparse.Namespace) -> None:
    from vitkit.evaluation import probe_report

    print_report(probe_report(args.weights, args.data, args.data_dir, args.k,
                              args.temperature, args.json, args.weights_dir))


def add_frozen_feature_verbs(verbs: Any) -> None:
    """`fewshot` and `probe`: evaluations of frozen features (cached between the two)."""
    data_help = ("digits, cifar10, cifar100, folder or hf:NAME_OR_PATH (default: the data a "
                 "training checkpoint records)")
    fewshot = verbs.add_parser("fewshot", help="few-shot linear evaluation of frozen features "
                                               "(the paper's, big_vision's ridge regression)")
    probe = verbs.add_parser("probe", help="linear probe (logistic regression; ridge R^2 for "
                                           "regression models) and kNN of frozen features")
    for parser in (fewshot, probe):
        add_weights_argument(parser)
        parser.add_argument("--data", help=data_help)
        parser.add_argument("--data-dir", help="local dataset folder")
        parser.add_argument("--json", metavar="FILE", type=output_file("report.json"),
                            help="also write the results as JSON")
    fewshot.add_argument("--shots", type=parse_shots, default=(1, 5, 10, 25),
                         help="images per class, comma-separated (default 1,5,10,25)")
    fewshot.add_argument("--seeds", type=positive_int, default=3,
                         help="draws of the training images per shot count (default 3)")
    fewshot.add_argument("--l2", type=non_negative_float, default=1024.0,
                         help="ridge regularisation (default 1024 = 2^10, big_vision's)")
    fewshot.add_argument("compare", nargs="*", metavar="MORE_WEIGHTS",
                         help="more weights to compare on the same data, shots and seeds "
                              "(one curve each in fewshot.png)")
    fewshot.add_argument("--out", type=output_folder,
                         help="folder for fewshot.png (default: beside the first "
                                       "weights, as for `vitkit eval`: in a run or model "
                                       "folder; ./eval for a checkpoint name or hf-hub: "
                                       "repository)")
    fewshot.set_defaults(run=cmd_fewshot)
    probe.add_argument("--k", type=positive_int, default=20, help="kNN neighbours (default 20)")
    probe.add_argument("--temperature", type=positive_float, default=0.07,
                       help="kNN vote temperature (default 0.07, DINO's)")
    probe.set_defaults(run=cmd_probe)


class Parser(argparse.ArgumentParser):
    """argparse without abbreviated options: `train --data cifar10` was read as
    `--data-dir cifar10`, the only option it began."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, allow_abbrev=False, **kwargs)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="vitkit", description=__doc__)
    parser.add_argument("--version", action="version", version=f"vitkit {__version__}")
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    models = verbs.add_parser("models", help="list model names with their sizes")
    models.add_argument("--checkpoints", action="store_true",
                        help="list every named checkpoint with its URL and ImageNet top-1")
    models.set_defaults(run=cmd_models)

    summary = verbs.add_parser("summary", help="layer table with output shapes and parameters")
    add_model_arguments(summary)
    summary.add_argument("--max-depth", type=positive_int, default=1,
                         help="1: blocks; 2: their layers; 3: every Linear")
    summary.set_defaults(run=cmd_summary)

    train = verbs.add_parser("train", help="train from scratch (default: the embedded digits)")
    train.add_argument("recipe", nargs="?", default=None,
                       help="recipe JSON file or shipped recipe name (digits, cifar10, ...); "
                            "default: digits; with data=... another source, TrainConfig's "
                            "defaults; with --resume the checkpoint's recipe")
    add_run_arguments(train, "recipe", "epochs=5 model.depth=4 augment.flip=false")
    train.add_argument("--data", help="the data to train on, as data=... sets it: digits, "
                                      "cifar10, cifar100, folder, arrays or hf:NAME_OR_PATH")
    train.set_defaults(run=cmd_train)

    finetune = verbs.add_parser("finetune", help="fine-tune pretrained weights (the paper's "
                                                 "recipe: SGD, new head, higher resolution)")
    add_weights_argument(finetune)
    add_run_arguments(finetune, "finetune recipe", "lr=0.01 total_steps=500")
    finetune.add_argument("--data", help="digits, cifar10, cifar100, folder or hf:NAME_OR_PATH "
                          "(default: the data a vitkit run recorded, else cifar10)")
    finetune.add_argument("--img-size", type=parse_img_size, help="fine-tuning resolution "
                                                                  "(default: 384 for weights "
                                                                  "pretrained at 224, else "
                                                                  "their own size)")
    finetune.set_defaults(run=cmd_finetune)

    evaluate = verbs.add_parser("eval", help="top-1/top-5, per-class accuracy, confusion PNG")
    add_weights_argument(evaluate)
    evaluate.add_argument("--data", default=None,
                          help="digits, cifar10, cifar100, folder or hf:NAME_OR_PATH (default: "
                               "the data a training checkpoint records; required for other "
                               "weights)")
    evaluate.add_argument("--data-dir", help="local dataset folder")
    evaluate.add_argument("--split",
                          help="train, test (the held-out split: a folder's val/ or test/, or "
                               "its class sub-folders when it has no train/; val names it "
                               "too; a Hugging Face dataset's split named test where it has "
                               "one), or "
                               "any split name of a Hugging Face dataset (default: the "
                               "held-out split: the one the run evaluated on, for a Hugging "
                               "Face dataset validation before test)")
    evaluate.add_argument("--limit", type=image_count,
                          help="evaluate only the first N images, or all (default: as the "
                               "training run did, its test_limit)")
    evaluate.add_argument("--batch-size", type=positive_int, default=500)
    evaluate.add_argument("--out", type=output_folder,
                          help="folder for the report and confusion_matrix.png "
                                        "(default: beside the weights; ./eval for a "
                                        "checkpoint name or hf-hub: repository). Each "
                                        "evaluation keeps eval-DATA-SPLIT.json (-int8, -bf16, "
                                        "-mergeR, -flip for those paths; DATA-FOLDER with "
                                        "--data-dir); eval.json is the latest")
    add_inference_arguments(evaluate)
    evaluate.add_argument("--json", action="store_true", help="print the report as one JSON "
                                                              "object (what eval.json holds)")
    evaluate.set_defaults(run=cmd_eval)

    predict = verbs.add_parser("predict", help="top-k classes (or the task's values or labels) "
                                               "of images with a checkpoint")
    add_weights_argument(predict)
    predict.add_argument("inputs", nargs="*", metavar="INPUT",
                         help="image files, folders (searched recursively for images) or "
                              ".npy/.npz array files (one prediction per array image)")
    predict.add_argument("--sample", action="store_true", help="also predict the shipped "
                         "sample digit (a 3, light strokes on black, 8x8; its path is printed)")
    predict.add_argument("--topk", type=int, default=5, help="classes per image (default 5)")
    predict.add_argument("--json", action="store_true", help="one JSON object per line")
    predict.add_argument("--batch-size", type=int, default=32)
    add_inference_arguments(predict)
    predict.set_defaults(run=cmd_predict)
    export = verbs.add_parser("export", help="write ONNX (dynamic batch) and check it with "
                                             "onnxruntime")
    add_weights_argument(export)
    export.add_argument("--format", default="onnx", help="output format (only onnx)")
    export.add_argument("--out", help="output file (default: beside the weights, .onnx; a "
                                      "folder is refused, naming a file in it)")
    export.add_argument("--dynamic-size", action="store_true",
                        help="also accept other image sizes (multiples of the patch size)")
    export.add_argument("--opset", type=int, help="ONNX opset (default: torch's)")
    add_int8_arguments(export, "the ONNX graph, with onnxruntime's quantize_dynamic (int8 "
                       "MatMul/Gemm weights), checked against the float model; default "
                       "output .int8.onnx", eager=False)
    add_merge_tokens_argument(export, "; in the graph, at the model's image size (not with "
                                      "--dynamic-size); default output .mergeR.onnx")
    export.set_defaults(run=cmd_export)
    explain = verbs.add_parser("explain", help="attention rollout and maps, mean attention "
                                               "distance, position and filter figures")
    add_weights_argument(explain)
    explain.add_argument("images", nargs="*", metavar="IMAGE",
                         help="image files, folders or .npy/.npz array files (default: test "
                              "images of --data)")
    explain.add_argument("--out", required=True, type=output_folder,
                         help="folder for the PNGs and explain.json")
    explain.add_argument("--head-fusion", default="mean", choices=("mean", "max", "min"))
    explain.add_argument("--discard-ratio", type=fraction_below_one, default=0.0,
                         help="zero this fraction (in [0, 1)) of the weakest attentions "
                              "(rollout)")
    explain.add_argument("--num-images", type=int,
                         help="test images to sample across classes when no IMAGE is given; "
                              "all count in the mean attention distance (default 128, the "
                              "paper's; fewer when the test split is smaller)")
    explain.add_argument("--show", type=int, default=8,
                         help="images drawn in the rollout figure (default 8)")
    explain.add_argument("--seed", type=int, default=0,
                         help="seed of the class-stratified sample of test images")
    explain.add_argument("--data", help="digits, cifar10, cifar100 or folder (default: as "
                                        "trained)")
    explain.add_argument("--data-dir", help="local dataset folder")
    explain.set_defaults(run=cmd_explain)

    bench = verbs.add_parser("benchmark", help="inference images/s, latency, peak memory, "
                                               "FLOPs and MFU (--sweep: Figure 12)")
    bench.add_argument("model", nargs="?", metavar="MODEL_OR_WEIGHTS",
                       help="variant ('B/16', 'cifar10-tutorial', ...: random weights) or "
                            "weights file, folder, run folder or hf-hub:ORG/NAME")
    bench.add_argument("--img-size", type=parse_img_size,
                       help="image size (default: the model's; positions resampled)")
    bench.add_argument("--batch-size", type=positive_int, default=8,
                       help="batch of the images/s measurement (default 8)")
    add_int8_arguments(bench, "--engine torch: the engine --int8-engine names (default "
                              "auto: the fastest measured of torch's, oneDNN's and ONNX "
                              "Runtime's; vitkit.inference.quantize.quantize_int8); --engine "
                              "onnxruntime: the exported graph's (onnxruntime "
                              "quantize_dynamic)")
    add_precision_argument(bench)
    add_merge_tokens_argument(bench)
    bench.add_argument("--engine", default="torch", choices=("torch", "onnxruntime"),
                       help="torch (default) or onnxruntime (exported with vitkit export)")
    bench.add_argument("--compile", action="store_true",
                       help="torch.compile the model with its weights frozen (inductor "
                            "freezing); the compile time is reported apart")
    bench.add_argument("--threads", type=positive_int,
                       help="intra-op threads (default: torch's)")
    bench.add_argument("--warmup", type=non_negative_int, default=3,
                       help="untimed calls after the first (default 3)")
    bench.add_argument("--iters", type=positive_int, default=10,
                       help="timed calls; medians are reported (default 10)")
    bench.add_argument("--json", action="store_true",
                       help="one JSON object (per sweep row) instead of the table")
    bench.add_argument("--weights-dir", help="folder for downloaded named checkpoints")
    bench.add_argument("--sweep", action="store_true",
                       help="variants x resolutions (the paper's Figure 12): images/s and "
                            "the largest batch that fits --memory-gb")
    bench.add_argument("--variants", help="sweep variants, comma-separated (default "
                                          "Ti/16,S/16,B/16,B/32,L/16)")
    bench.add_argument("--resolutions",
                       help="sweep resolutions, comma-separated (default 224,384)")
    bench.add_argument("--memory-gb", type=positive_float,
                       help="sweep memory cap (default: 0.8 x the available memory)")
    bench.add_argument("--out", type=output_file("sweep.png", FIGURE_SUFFIXES),
                       help="sweep figure (PNG, or another format by its suffix: pdf, svg, "
                            "...; .png is added to a name without one; default "
                            "benchmark_sweep.png)")
    bench.set_defaults(run=cmd_benchmark)

    add_frozen_feature_verbs(verbs)
    from vitkit.serve.command import add_serve_verb  # argparse only: FastAPI loads on use
    add_serve_verb(verbs)
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


if __name__ == "__main__":
    sys.exit(main())
