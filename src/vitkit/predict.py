"""Predict with a model on image files and array files, using the checkpoint's own
preprocessing, class or target names and task.

Folders are searched recursively for images (sorted); a file reached twice (named twice, or
through a folder and by name) is predicted once; inputs run in batches. A file that cannot be
read gets a `Prediction` with `error` set and does not stop the others.

Array files (`.npy`, `.npz` with `images`; `vitkit.data.array_inputs`) give one prediction per
image, named `file.npy[i]`, normalised with the model's `Preprocess` and resized to the
model's size when theirs differs (bilinear, antialiased when shrinking; logged). Inputs the
model's units or channels do not fit are refused by name, never guessed: a float array for
a model trained on 8-bit pictures, an image file for one trained on arrays, an array that
is one image of other channels. Folders are
searched for images only: name array files one by one (a shell glob: fields/*.npy).

What a prediction says is the model's task (`vitkit.tasks.task_of`): classification, the
top-k classes; regression, the values in the targets' units (de-standardised) under the
target names; multi-label, the labels at or above 0.5 and every label's probability. The model
runs as eval and serve run it: through one `vitkit.inference.predictor.Predictor` (its token
merging, precision and test-time augmentation).

Weights trained on the embedded digits (a vitkit run with data=digits) expect light strokes on
a black background: the report says so, and an image that looks dark on light is warned about.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitkit.data.array_inputs import (
    ARRAY_EXTENSIONS,
    PICTURE_REFUSED,
    array_items,
    image_file_refusal,
    is_array_file,
    read_array_images,
)
from vitkit.data.image_decoder import decode_image
from vitkit.data.sources.digits import INPUT_NOTE, INVERTED_WARNING, looks_inverted
from vitkit.data.sources.folder import IMAGE_EXTENSIONS
from vitkit.data.transforms import to_model_size
from vitkit.errors import InputError
from vitkit.inference.prediction import Prediction, check_topk, fill_predictions
from vitkit.inference.predictor import InferenceOptions, Predictor, class_names_for
from vitkit.inference.tta import check_tta
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess
from vitkit.tasks import value_names

# Prediction, fill_predictions and class_names_for live below the verbs
# (`vitkit.inference.prediction`, `vitkit.inference.predictor`); array_items in
# `vitkit.data.array_inputs`. They stay importable from here.
__all__ = ["Prediction", "Predictions", "array_items", "class_names_for", "expand_inputs",
           "fill_predictions", "output_names", "predict", "predict_files", "predict_with",
           "read_inputs"]

log = logging.getLogger(__name__)
PARTIAL_EXIT_STATUS = 1  # some inputs could not be read, the others were predicted


output_names = value_names  # how regression outputs are shown ("value", "value[j]")


@dataclass
class Predictions:
    """`vitkit predict`'s report: one `Prediction` per file, in order, and notes on what the
    model expects (printed after the predictions; not in the JSON lines)."""

    results: list[Prediction]
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> list[str]:
        """The files that could not be read."""
        return [result.path for result in self.results if not result.ok]

    def none_read_message(self) -> str:
        """The error when no input could be read (the rows say why for each)."""
        bad = [result for result in self.results if not result.ok]
        # a picture refused by a model trained on arrays: say so, not "not an image"; the
        # reason and its fix are on the first such row, printed once
        refused = [result for result in bad if PICTURE_REFUSED in (result.error or "")]
        if refused:
            return (f"none of the {len(bad)} input(s) could be read: image files (8-bit "
                    f"pictures) for a model trained on arrays; the row of {refused[0].path} "
                    "says why and what to give it instead")
        if not any(is_array_file(result.path.rpartition("[")[0] if result.path.endswith("]")
                                 else result.path) for result in bad):
            return (f"none of the {len(bad)} file(s) could be read as an image; check they are "
                    "valid image files")
        return f"none of the {len(bad)} input(s) could be read ({bad[0].path}: {bad[0].error})"

    def outcome(self) -> tuple[int, str | None]:
        """How `vitkit predict` ends once the rows are printed: (0, None) when every input was
        predicted; (PARTIAL_EXIT_STATUS, the line naming the files that could not be read)
        when only some were; InputError (`none_read_message`) when none could."""
        failed = self.failed
        if len(failed) == len(self.results):
            raise InputError(self.none_read_message())
        if failed:
            return PARTIAL_EXIT_STATUS, (f"{len(failed)} of {len(self.results)} files could not "
                                         "be read: " + ", ".join(failed))
        return 0, None

    def format(self) -> str:
        return "\n".join([*(result.format() for result in self.results),
                          *(f"note: {note}" for note in self.notes)])

    def to_dict(self) -> dict[str, Any]:
        notes = {"notes": self.notes} if self.notes else {}
        return {"predictions": [result.to_dict() for result in self.results], **notes}

    def json_lines(self) -> str:
        """One JSON object per file and line (`vitkit predict --json`)."""
        return "\n".join(json.dumps(result.to_dict()) for result in self.results)


def images_under(folder: Path) -> list[Path]:
    """The image files under `folder`, recursively and sorted, hidden ones left out; linked
    folders are followed (as training reads them), each real folder once."""
    found: list[Path] = []
    visited: set[str] = set()
    for root, folders, names in os.walk(folder, followlinks=True):
        real = os.path.realpath(root)
        if real in visited:  # a link back into the tree
            folders[:] = []
            continue
        visited.add(real)
        folders[:] = [name for name in folders if not name.startswith(".")]
        found += [Path(root, name) for name in names if not name.startswith(".")
                  and os.path.splitext(name)[1].lower() in IMAGE_EXTENSIONS
                  and os.path.isfile(os.path.join(root, name))]
    return sorted(found)


def expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Files as given; folders replaced by their image files (recursive, sorted, no hidden).

    Each file appears once, where it is first reached (paths are compared resolved)."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if not path.exists():
            raise InputError(f"{path} does not exist; pass image files, folders of images or "
                             f"array files ({', '.join(ARRAY_EXTENSIONS)})")
        if not path.is_dir():
            files.append(path)
            continue
        found = images_under(path)
        if not found:
            arrays = sorted(p.name for p in path.iterdir() if is_array_file(p))
            advice = (f"it holds {len(arrays)} array file(s) ({arrays[0]}...), which folders "
                      "are not searched for: name them one by one (a shell glob: "
                      f"{path}/*{Path(arrays[0]).suffix})" if arrays else
                      "pass a folder with images or the image files themselves")
            raise InputError(f"folder {path} holds no images (looked for "
                             f"{', '.join(sorted(IMAGE_EXTENSIONS))}); {advice}")
        files.extend(found)
    if not files:
        raise InputError("no inputs: pass at least one image file or folder (or, to vitkit "
                         "predict, --sample: the shipped sample digit)")
    return _unique(files)


def _unique(files: list[Path]) -> list[Path]:
    seen: set[Path] = set()
    unique = []
    for path in files:
        key = path.resolve()
        if key not in seen:
            seen.add(key)
            unique.append(path)
    return unique


def _open(path: Path, preprocess: Preprocess) -> torch.Tensor | str:
    """(C, H, W) uint8 tensor of one file, or a short reason it could not be read (or cannot
    go to this model: a picture for a model trained on arrays, `image_file_refusal`)."""
    refusal = image_file_refusal(path, preprocess.scale)
    if refusal is not None:
        return refusal
    decoded = decode_image(path, preprocess.channels)
    if decoded.image is None:
        return f"cannot read image ({decoded.reason}); {decoded.fix}"
    return to_model_size(decoded.image, preprocess)


Item = tuple[str, "torch.Tensor | str"]


def _array_items(path: Path, preprocess: Preprocess) -> Iterator[Item]:
    """`array_items` of an array file, or (file, why it cannot be read)."""
    try:
        arrays = read_array_images(path, preprocess.channels, preprocess.scale,
                                   img_size=preprocess.img_size)
    except InputError as exc:
        yield str(path), str(exc)
        return
    yield from array_items(arrays, preprocess)


def read_inputs(files: Sequence[Path], preprocess: Preprocess) -> Iterator[Item]:
    """(name, (C, H, W) uint8 or float image at the model's size, or why it could not be
    read) for each image of the files, in order: one per image file, one per array image."""
    for path in files:
        if is_array_file(path):
            yield from _array_items(path, preprocess)
        else:
            yield str(path), _open(path, preprocess)


def _chunks(items: Iterable[Item], size: int) -> Iterator[list[Item]]:
    chunk: list[Item] = []
    for item in items:
        chunk.append(item)
        if len(chunk) == size:
            yield chunk
            chunk = []
    if chunk:
        yield chunk


def predict(model: VisionTransformer, inputs: Iterable[str | Path], topk: int = 5,
            batch_size: int = 32, trained_on: str | None = None, precision: str | None = None,
            int8: str | None = None, tta: str = "none") -> list[Prediction]:
    """Predictions for image files, folders and array files, one `Prediction` per image.

    Images go through `model.preprocess` (the official squash-resize to [-1, 1] when the
    model has none) on the model's device and dtype. What is predicted is the model's task
    (`task_of`): top-k softmax classes (`topk` capped at the class count), regression values
    (de-standardised) or multi-label probabilities. `trained_on`: the data the weights were
    trained on (a vitkit run's `data`); for "digits", images that look dark on light get a
    warning (`INVERTED_WARNING`). `precision` (fp32, bf16, int8 or auto; None: fp32, or int8
    with `int8`, an engine of `vitkit.inference.quantize`) is the number format the forward
    runs in (`vitkit.inference.precision`; auto measures on the first batch); a requested
    one is logged with the reason for the choice. `tta` "flip" averages the outputs on each
    image and its mirror image (`vitkit.inference.tta`).
    """
    check_tta(tta)
    check_topk(topk)
    check_batch_size(batch_size)
    options = InferenceOptions(precision, int8, tta=tta, measure_batch=None)
    return predict_with(Predictor.from_model(model, options), inputs, topk, batch_size,
                        trained_on)


def check_batch_size(batch_size: int) -> int:
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    return batch_size


def predict_with(predictor: Predictor, inputs: Iterable[str | Path], topk: int = 5,
                 batch_size: int = 32, trained_on: str | None = None) -> list[Prediction]:
    """`predict` through a `Predictor`: the files read in batches of `batch_size` (`inputs`
    expanded by `expand_inputs`), each batch through `predictor` (a precision to measure is
    chosen on the first), one `Prediction` per image (`Predictor.predictions`)."""
    check_topk(topk)
    check_batch_size(batch_size)
    predictor.names  # noqa: B018  # a model without a head is refused before any file is read
    files = expand_inputs(inputs)
    results: list[Prediction] = []
    inverted: list[str] = []
    refused: list[str] = []  # pictures for a model trained on arrays (`_once`)
    for chunk in _chunks(read_inputs(files, predictor.preprocess), batch_size):
        rows = [Prediction(name, error=_once(x, name, refused) if isinstance(x, str) else None)
                for name, x in chunk]
        good = [i for i, (_, x) in enumerate(chunk) if isinstance(x, torch.Tensor)]
        if trained_on == "digits":
            inverted += [chunk[i][0] for i in good
                         if chunk[i][1].dtype == torch.uint8 and looks_inverted(chunk[i][1])]
        if good:
            outputs = predictor([chunk[i][1] for i in good])
            fill_predictions([rows[i] for i in good], outputs, predictor.task, predictor.names,
                             topk)
        results.extend(rows)
    if inverted:
        listed = ", ".join(inverted[:3]) + (f" and {len(inverted) - 3} more"
                                            if len(inverted) > 3 else "")
        log.warning("warning: %d image(s) look like dark strokes on a light background (%s): "
                    "%s", len(inverted), listed, INVERTED_WARNING)
    return results


def _once(error: str, name: str, refused: list[str]) -> str:
    """A row's error, the picture refusal (`image_file_refusal`) in full on its first row
    only: it is the same for every picture, so later rows name the first (`refused` holds the
    pictures met so far)."""
    if PICTURE_REFUSED not in error:
        return error
    refused.append(name)
    if len(refused) == 1:
        return error
    return (f"{name} {PICTURE_REFUSED}, refused as {refused[0]} is (the model was trained on "
            "arrays; that row says what to give it)")


def _trained_on_words(data: str | None) -> str:
    return f"was trained on {data}" if data else "takes other images (not 8x8, one channel)"


def predict_files(weights: str | Path, inputs: Iterable[str | Path], topk: int = 5,
                  batch_size: int = 32, weights_dir: str | Path | None = None,
                  merge_tokens: int = 0, int8: str | None = None,
                  precision: str | None = None, tta: str | None = None, *,
                  sample: bool = False, options: InferenceOptions | None = None) -> Predictions:
    """`predict` with weights any source `load_pretrained` reads, through the speed paths
    (`options`, or as loose arguments `merge_tokens` per layer, then `precision`, `int8` an
    engine of `vitkit.inference.int8_engines`; `tta` as in `predict`, None: the training
    run's; a `--precision auto` measures on the first batch). A wrong path or a contradiction
    in the options fails before the model loads. `sample` adds the shipped sample digit to the
    inputs (`--sample`). Weights a vitkit run trained on the embedded digits get a note on
    the input they expect (`INPUT_NOTE`)."""
    from vitkit.data.sources.digits import sample_digit

    files = expand_inputs([*inputs, *([sample_digit()] if sample else [])])
    options = InferenceOptions.given(options, precision=precision, int8=int8,
                                     merge_tokens=merge_tokens, tta=tta, measure_batch=None)
    predictor = Predictor.load(weights, options, weights_dir)
    trained_on = predictor.provenance.trained_on
    notes = [f"{INPUT_NOTE} (a sample: vitkit predict {weights} --sample)"] \
        if trained_on == "digits" else []
    config = predictor.model.config
    digit_sized = config.in_chans == 1 and tuple(config.img_size) == (8, 8)
    if trained_on != "digits" and not digit_sized and sample_digit() in files:
        notes.append(f"the shipped sample (--sample) is an 8x8 digit, for models trained on "
                     f"the digits; {weights} {_trained_on_words(trained_on)}, so its "
                     "prediction for the sample says nothing about the model: give images of "
                     "its own kind")
    return Predictions(predict_with(predictor, files, topk, batch_size, trained_on), notes)
