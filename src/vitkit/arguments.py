"""The flags several verbs share, and their value types: one definition each, so `--int8`,
`--precision`, `--merge-tokens` or a positive integer mean the same on every verb (the verb
modules of `vitkit.cli` and serve/command.py build their parsers from here)."""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from vitkit.fieldtypes import parse_size
from vitkit.files import names_folder

if TYPE_CHECKING:
    from vitkit.inference.predictor import InferenceOptions

__all__ = ["EAGER_INT8", "INT8_HELP", "add_inference_arguments", "add_int8_arguments",
           "add_merge_tokens_argument", "add_precision_argument", "add_tta_argument",
           "add_weights_argument", "image_count", "inference_options", "int8_engine",
           "int_at_least",
           "non_negative_float", "non_negative_int", "output_file", "output_folder",
           "parse_img_size", "positive_float", "positive_int"]

def parse_img_size(text: str) -> int | tuple[int, int]:
    """"224" -> 224; "60x100", "60,100" or "[60, 100]" -> (60, 100)."""
    size = parse_size(text)
    if size is None:
        raise argparse.ArgumentTypeError(
            f"image size {text!r} is not an int or HxW (e.g. 224 or 60x100)")
    return size[0] if text.strip().isdigit() else size


def int_at_least(text: str, minimum: int) -> int:
    """`text` as an integer >= `minimum`, or an argparse error saying which it is not."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be >= {minimum}, got {value}")
    return value


def positive_int(text: str) -> int:
    """An argparse type: an integer >= 1."""
    return int_at_least(text, 1)


def image_count(text: str) -> int | str:
    """An argparse type: a number of images >= 1, or "all"."""
    if text.strip().lower() == "all":
        return "all"
    try:
        return positive_int(text)
    except argparse.ArgumentTypeError as exc:
        raise argparse.ArgumentTypeError(f"{exc}; give a number of images (>= 1) or all"
                                         ) from None


def non_negative_int(text: str) -> int:
    """An argparse type: an integer >= 0."""
    return int_at_least(text, 0)


def positive_float(text: str) -> float:
    """An argparse type: a finite number > 0."""
    value = _finite_float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def non_negative_float(text: str) -> float:
    """An argparse type: a finite number >= 0."""
    value = _finite_float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {text}")
    return value


def fraction_below_one(text: str) -> float:
    """An argparse type: a number in [0, 1)."""
    value = _finite_float(text)
    if not 0 <= value < 1:
        raise argparse.ArgumentTypeError(f"must be in [0, 1), got {text}")
    return value


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
    return value


def output_folder(text: str) -> str:
    """An --out that is a folder (made if missing): refused at once when it, or a folder above
    it, is a file."""
    _refuse_file_above(text, Path(text).expanduser())
    return text


def output_file(example: str, suffixes: tuple[str, ...] = ()) -> Callable[[str], str]:
    """The argparse type of a file to write (`example`: a file name to suggest): refused at once
    when it is a folder, when it names one (ends in a path separator, or in "." or "..": `DIR/`
    means a folder even before DIR exists, and `Path` would drop the slash and write a file
    DIR), or when a folder above it is a file; an existing file is refused unless it ends as
    `example` does or in one of `suffixes` (a report may replace an earlier report, never a
    checkpoint or data)."""
    suffix = Path(example).suffix
    allowed = {suffix, *suffixes}

    def checked(text: str) -> str:
        path = Path(text).expanduser()
        if path.is_dir() or names_folder(text):
            verb = "is" if path.is_dir() else "names"
            raise argparse.ArgumentTypeError(f"{text} {verb} a folder: give the file to write, "
                                             f"e.g. {path / example}")
        if path.exists() and path.suffix.lower() not in allowed:
            raise argparse.ArgumentTypeError(
                f"{text} exists and is not a {suffix} file: writing the report there would "
                f"replace it; give a {suffix} path, e.g. {path.with_name(example)}")
        _refuse_file_above(text, path.parent)
        return text

    return checked


def _refuse_file_above(text: str, folder: Path) -> None:
    for above in (folder, *folder.parents):
        if above.exists():
            if not above.is_dir():
                where = text if above == Path(text).expanduser() else f"{text}: {above}"
                raise argparse.ArgumentTypeError(f"{where} is a file, where a folder is "
                                                 "needed: give a folder path")
            return


def add_weights_argument(parser: argparse.ArgumentParser) -> None:
    """WEIGHTS (anything `vitkit.catalog` resolves) and --weights-dir, on every verb that loads."""
    parser.add_argument("weights", help="weights file, model folder, training run folder, "
                                        "checkpoint name (e.g. B/16-i21k; `vitkit models "
                                        "--checkpoints` lists them) or Hub repository "
                                        "(hf-hub:ORG/NAME[@REVISION])")
    parser.add_argument("--weights-dir", help="folder for downloaded named checkpoints")


INT8_HELP = ("int8 weights for this verb's engine (dynamic quantisation: weights stored as int8, "
             "activations quantised per batch): {engine}")
EAGER_INT8 = ("PyTorch on the CPU, every nn.Linear (--int8-engine picks the "
              "implementation)")


def add_int8_arguments(parser: argparse.ArgumentParser, engine: str,
                       eager: bool = True) -> None:
    """--int8, one meaning on every verb: int8 weights for the engine the verb runs; with
    `eager` (a PyTorch engine) also --int8-engine, the implementation (implies --int8)."""
    from vitkit.inference.int8_engines import AUTO, ENGINES

    parser.add_argument("--int8", action="store_true", help=INT8_HELP.format(engine=engine))
    if eager:
        parser.add_argument("--int8-engine", choices=(*ENGINES, AUTO), default=None,
                            help=f"int8 implementation (default {AUTO}: the fastest measured "
                                 "here; implies --int8)")


def int8_engine(args: argparse.Namespace) -> str | None:
    """The eager int8 engine the flags ask for, or None for float."""
    from vitkit.inference.quantize import int8_engine as engine_for

    return engine_for(args.int8, args.int8_engine)


def inference_options(args: argparse.Namespace) -> InferenceOptions:
    """The `InferenceOptions` the inference flags ask for (--precision, --int8 and
    --int8-engine, --merge-tokens, --tta); the verb's library call sets the batch auto
    measures at. A contradiction (--int8 with another --precision) is refused here."""
    from vitkit.inference.predictor import InferenceOptions

    return InferenceOptions(args.precision, int8_engine(args), args.merge_tokens, args.tta)


def add_merge_tokens_argument(parser: argparse.ArgumentParser, note: str = "") -> None:
    """--merge-tokens R, the same flag on every verb that takes it."""
    parser.add_argument("--merge-tokens", type=non_negative_int, default=0, metavar="R",
                        help="Token Merging (ToMe): merge R tokens in every layer (default "
                             f"0){note}")


def add_precision_argument(parser: argparse.ArgumentParser) -> None:
    """--precision fp32|bf16|int8|auto, the same flag on eval, predict and benchmark."""
    from vitkit.inference.precision import PRECISION_HELP, PRECISIONS

    parser.add_argument("--precision", choices=PRECISIONS, help=PRECISION_HELP)


def add_tta_argument(parser: argparse.ArgumentParser) -> None:
    """--tta none|flip (default: what the weights' training run used), on eval, predict and
    serve."""
    from vitkit.inference.tta import TTA_HELP, TTA_MODES

    parser.add_argument("--tta", choices=TTA_MODES, help=TTA_HELP)


def add_inference_arguments(parser: argparse.ArgumentParser) -> None:
    """The inference-path flags eval and predict share: --int8, --precision, --merge-tokens
    and --tta none|flip."""
    add_int8_arguments(parser, EAGER_INT8)
    add_precision_argument(parser)
    add_merge_tokens_argument(parser)
    add_tta_argument(parser)
