"""`vitkit <verb>`: a thin command-line layer over the library."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from vitkit.config import SIZES, list_model_names
from vitkit.errors import VitkitError
from vitkit.model.create import count_parameters, resolve_config


def parse_img_size(text: str) -> int | tuple[int, int]:
    """"224" -> 224; "60x100" or "60,100" -> (60, 100)."""
    parts = text.lower().replace(",", "x").split("x")
    try:
        sizes = [int(p) for p in parts]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"image size {text!r} is not an int or HxW (e.g. 224 or 60x100)") from None
    if len(sizes) == 1:
        return sizes[0]
    if len(sizes) == 2:
        return (sizes[0], sizes[1])
    raise argparse.ArgumentTypeError(f"image size {text!r} has more than two sides")


def parse_override(text: str) -> tuple[str, Any]:
    """"key=value": the value is read as JSON when it parses, else kept as a string."""
    if "=" not in text:
        raise argparse.ArgumentTypeError(f"override {text!r} is not KEY=VALUE")
    key, value = text.split("=", 1)
    try:
        return key.strip(), json.loads(value)
    except json.JSONDecodeError:
        return key.strip(), value


def model_overrides(args: argparse.Namespace) -> dict[str, Any]:
    overrides = dict(args.set or [])
    for key in ("img_size", "num_classes", "in_chans", "patch_size"):
        if getattr(args, key, None) is not None:
            overrides[key] = getattr(args, key)
    return overrides


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="variant ('B/16', 'S/32', ...), tutorial model name, "
                                      "or a JSON config file")
    parser.add_argument("--img-size", type=parse_img_size, help="224, or HxW like 60x100")
    parser.add_argument("--num-classes", type=int, help="classifier outputs (0: features only)")
    parser.add_argument("--in-chans", type=int, help="input channels")
    parser.add_argument("--patch-size", type=int, help="patch size P")
    parser.add_argument("--set", type=parse_override, action="append", metavar="KEY=VALUE",
                        help="any other config field, e.g. --set pool=mean_patches")


def cmd_models(args: argparse.Namespace) -> None:
    print(f"{'name':<18}{'layers':>7}{'width':>7}{'MLP':>7}{'heads':>7}{'image':>9}"
          f"{'params':>15}")
    for name in list_model_names():
        cfg = resolve_config(name)
        image = f"{cfg.img_size[0]}" if cfg.img_size[0] == cfg.img_size[1] else \
            f"{cfg.img_size[0]}x{cfg.img_size[1]}"
        print(f"{name:<18}{cfg.depth:>7}{cfg.width:>7}{cfg.mlp_dim:>7}{cfg.num_heads:>7}"
              f"{image:>9}{count_parameters(cfg):>15,}")
    sizes = "/".join(SIZES)
    print(f"\nAny size {sizes} with any patch size parses too (e.g. 'L/8', 'Ti/4'); "
          "change anything with keyword overrides.")


def cmd_summary(args: argparse.Namespace) -> None:
    from vitkit.summary import summarize

    config = resolve_config(args.model, **model_overrides(args))
    print(summarize(config, max_depth=args.max_depth).format())


def cmd_train(args: argparse.Namespace) -> None:
    import logging

    from vitkit.train.config import load_train_config
    from vitkit.train.loop import train

    logging.basicConfig(level=logging.INFO, format="%(message)s")
    overrides = list(args.overrides)
    for flag, key in ((args.time_budget, "time_budget"), (args.out, "out_dir"),
                      (args.data_dir, "data_dir")):
        if flag is not None:
            overrides.append(f"{key}={json.dumps(flag)}")
    cfg = load_train_config(args.recipe, overrides)
    result = train(cfg, resume=args.resume)
    if not result.is_main:
        return
    final = result.final
    if final:
        print(f"done: epoch {final['epoch']:.2f}, step {final['step']}, test top-1 "
              f"{100 * final['top1']:.2f}%, top-5 {100 * final['top5']:.2f}%, "
              f"{final['minutes']:.1f} min" + (f" ({result.stopped_early})"
                                                 if result.stopped_early else ""))
    print(f"checkpoints, metrics and learning_curve.png in {result.out_dir}")


def cmd_eval(args: argparse.Namespace) -> None:
    from vitkit.evaluate import evaluate_checkpoint

    report = evaluate_checkpoint(args.checkpoint, args.data, args.data_dir, args.split,
                                 args.out, args.limit, args.batch_size)
    print(report)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="vitkit", description=__doc__)
    verbs = parser.add_subparsers(dest="verb", required=True, metavar="VERB")

    models = verbs.add_parser("models", help="list model names with their sizes")
    models.set_defaults(run=cmd_models)

    summary = verbs.add_parser("summary", help="layer table with output shapes and parameters")
    add_model_arguments(summary)
    summary.add_argument("--max-depth", type=int, default=1,
                         help="1: blocks; 2: their layers; 3: every Linear")
    summary.set_defaults(run=cmd_summary)

    train = verbs.add_parser("train", help="train from scratch (default: the embedded digits)")
    train.add_argument("recipe", nargs="?", default="digits",
                       help="recipe JSON file or shipped recipe name (digits, cifar10, ...)")
    train.add_argument("overrides", nargs="*", metavar="KEY=VALUE",
                       help="recipe overrides, e.g. epochs=5 model.depth=4 augment.flip=false")
    train.add_argument("--resume", help="continue exactly from a last.pt checkpoint")
    train.add_argument("--time-budget", type=float, metavar="SECONDS",
                       help="size the schedule to this much training time and stop cleanly")
    train.add_argument("--out", help="output folder (default: the recipe's out_dir)")
    train.add_argument("--data-dir", help="local dataset folder (CIFAR binary, image folders)")
    train.set_defaults(run=cmd_train)

    evaluate = verbs.add_parser("eval", help="top-1/top-5, per-class accuracy, confusion PNG")
    evaluate.add_argument("checkpoint", help="a checkpoint written by `vitkit train`")
    evaluate.add_argument("--data", default=None,
                          help="digits, cifar10, cifar100 or folder (default: as trained)")
    evaluate.add_argument("--data-dir", help="local dataset folder")
    evaluate.add_argument("--split", default="test", choices=("train", "test"))
    evaluate.add_argument("--limit", type=int, help="evaluate only the first N images")
    evaluate.add_argument("--batch-size", type=int, default=500)
    evaluate.add_argument("--out", help="folder for confusion_matrix.png and eval.json")
    evaluate.set_defaults(run=cmd_eval)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.run(args)
    except VitkitError as exc:
        print(f"vitkit {args.verb}: error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
