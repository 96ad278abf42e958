"""`vitkit summary MODEL`: the layer table (`vitkit.summary.summarize`), with the model named
as everywhere (a variant, config file, checkpoint, ...) and its config changed by flags."""

from __future__ import annotations

import argparse
from typing import Any

from vitkit.arguments import parse_img_size, positive_int
from vitkit.config import ViTConfig
from vitkit.fieldtypes import parse_text


def add_parser(verbs: Any) -> None:
    parser = verbs.add_parser("summary", help="layer table with output shapes and parameters")
    add_model_arguments(parser)
    parser.add_argument("--max-depth", type=positive_int, default=1,
                        help="1: blocks; 2: their layers; 3: every Linear")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> None:
    from vitkit.summary import summarize

    print(summarize(args.model, max_depth=args.max_depth, **model_overrides(args)).format())


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
