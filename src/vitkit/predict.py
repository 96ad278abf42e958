"""Predict with a model on image files and array files, using the checkpoint's own
preprocessing, class or target names and task.

Folders are searched recursively for images (sorted); a file reached twice (named twice, or
through a folder and by name) is predicted once; inputs run in batches. A file that cannot be
read gets a `Prediction` with `error` set and does not stop the others.

Array files (`.npy`, `.npz` with `images`; `vitkit.data.arrayfiles`) give one prediction per
image, named `file.npy[i]`, normalised with the model's `Preprocess` and resized to the
model's size when theirs differs (bilinear, antialiased when shrinking; logged). Inputs the
model's units or channels do not fit are refused by name, never guessed: a float array for
a model trained on 8-bit pictures, an image file for one trained on arrays, an array that
is one image of other channels. Folders are
searched for images only: name array files one by one (a shell glob: fields/*.npy).

What a prediction says is the model's task (`vitkit.tasks.task_of`): classification, the
top-k classes; regression, the values in the targets' units (de-standardised) under the
target names; multi-label, the labels at or above 0.5 and every label's probability.

Weights trained on the embedded digits (a vitkit run with data=digits) expect light strokes on
a black background: the report says so, and an image that looks dark on light is warned about.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitkit.data.arrayfiles import (
    ARRAY_EXTENSIONS,
    PICTURE_REFUSED,
    ArrayImages,
    image_file_refusal,
    is_array_file,
    read_array_images,
)
from vitkit.data.augment import resize_batch
from vitkit.data.classnames import imagenet_class_names
from vitkit.data.images import decode_image
from vitkit.data.sources.digits import INPUT_NOTE, INVERTED_WARNING, looks_inverted
from vitkit.data.sources.folder import IMAGE_EXTENSIONS
from vitkit.errors import ConfigError, InputError
from vitkit.inference.precision import (
    Precision,
    requested_precision,
    run_in_precision,
)
from vitkit.inference.tta import check_tta, recorded_tta, warn_if_never_flipped, with_tta
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess, preprocess_for
from vitkit.tasks import Task, task_of

__all__ = ["Prediction", "Predictions", "array_items", "class_names_for", "expand_inputs",
           "fill_predictions", "in_precision", "input_batch", "output_names", "predict",
           "predict_files", "read_inputs", "run_batch"]

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    """What the model says of one image, or why it could not be read.

    Classification: the top-k classes (`labels`, `indices`, `probs`, most probable first).
    Other tasks: `report`, the task's `describe` of the image (regression: "values" in the
    targets' units; multi-label: "probs" per label and the "labels" at or above 0.5), and
    `names`, the output names the model stores (None: unnamed outputs).
    """

    path: str
    labels: list[str] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    error: str | None = None
    task: str = "classification"
    report: dict[str, Any] = field(default_factory=dict)
    names: list[str] | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        """{"path", "topk": [{"label", "index", "prob"}, ...]} (classification), {"path",
        "values", "names"} (regression), {"path", "probs": {label: p}, "labels"}
        (multi-label), or {"path", "error"}."""
        if self.error is not None:
            return {"path": self.path, "error": self.error}
        if self.task == "regression":
            return {"path": self.path, "values": self.report["values"], "names": self.names}
        if self.task == "multilabel":
            return {"path": self.path, "probs": self.report["probs"],
                    "labels": self.report["labels"]}
        return {"path": self.path, "topk": [
            {"label": label, "index": index, "prob": prob}
            for label, index, prob in zip(self.labels, self.indices, self.probs, strict=True)]}

    def format(self) -> str:
        """One line: "path: label (12.34%), ..." (classification and multi-label),
        "path: name=value, ..." (regression) or "path: error: ..."."""
        if self.error is not None:
            return f"{self.path}: error: {self.error}"
        if self.task == "regression":
            values = self.report["values"]
            shown = output_names(self.names, len(values))
            return f"{self.path}: " + ", ".join(f"{name}={value:.4g}"
                                                for name, value in zip(shown, values,
                                                                       strict=True))
        if self.task == "multilabel":
            probs = self.report["probs"]
            if not self.report["labels"]:
                top = max(probs, key=probs.__getitem__)
                return (f"{self.path}: no label at 50% or more (highest: {top} "
                        f"{100 * probs[top]:.2f}%)")
            return f"{self.path}: " + ", ".join(f"{label} ({100 * probs[label]:.2f}%)"
                                                for label in self.report["labels"])
        top = ", ".join(f"{label} ({100 * prob:.2f}%)"
                        for label, prob in zip(self.labels, self.probs, strict=True))
        return f"{self.path}: {top}"


def output_names(names: Sequence[str] | None, count: int) -> list[str]:
    """How regression outputs are shown: the stored names, else "value" (one output) or
    "value[j]"."""
    if names and len(names) >= count:
        return list(names[:count])
    return ["value"] if count == 1 else [f"value[{j}]" for j in range(count)]


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
        # a picture refused by a model trained on arrays: say so, not "not an image"
        refused = [result for result in bad if PICTURE_REFUSED in (result.error or "")]
        if refused:
            return f"none of the {len(bad)} input(s) could be read: {refused[0].error}"
        if not any(is_array_file(result.path.rpartition("[")[0] if result.path.endswith("]")
                                 else result.path) for result in bad):
            return (f"none of the {len(bad)} file(s) could be read as an image; check they are "
                    "valid image files")
        return f"none of the {len(bad)} input(s) could be read ({bad[0].path}: {bad[0].error})"

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


def class_names_for(model: VisionTransformer) -> list[str]:
    """`model.class_names` (the checkpoint's), else ImageNet-1k/21k names by head size, else
    "class N". A head larger than the stored names (a 10-way head trained on 3 classes) keeps
    the names and calls the outputs past them "class N"."""
    num_classes = model.config.num_classes
    if num_classes <= 0:
        raise ConfigError("this model has no classification head (num_classes=0), so it "
                          "cannot predict classes; load weights that include a head, or "
                          "fine-tune one first")
    names = list(model.class_names or [])
    if 0 < len(names) <= num_classes:
        return names + [f"class {i}" for i in range(len(names), num_classes)]
    return imagenet_class_names(num_classes) or [f"class {i}" for i in range(num_classes)]


def _open(path: Path, preprocess: Preprocess) -> torch.Tensor | str:
    """(C, H, W) uint8 tensor of one file, or a short reason it could not be read (or cannot
    go to this model: a picture for a model trained on arrays, `image_file_refusal`)."""
    refusal = image_file_refusal(path, preprocess.scale)
    if refusal is not None:
        return refusal
    decoded = decode_image(path, preprocess.channels)
    if decoded.image is None:
        return f"cannot read image ({decoded.reason}); {decoded.fix}"
    return preprocess.to_uint8(decoded.image)


Item = tuple[str, "torch.Tensor | str"]


def array_items(arrays: ArrayImages, preprocess: Preprocess) -> Iterator[Item]:
    """("file.npy[i]", (C, H, W) image at the model's size) per image of an array file read
    by `read_array_images`, or (that name, why the image cannot be used: NaN or inf)."""
    size = tuple(arrays.array.shape[-2:])
    if size != tuple(preprocess.img_size):
        log.info("%s: images are %dx%d and the model takes %dx%d: resizing them (bilinear, "
                 "antialiased when shrinking)", arrays.path, *size, *preprocess.img_size)
    for index in range(len(arrays)):
        try:
            image = arrays.tensor(index, index + 1)
        except InputError as exc:
            yield arrays.name(index), str(exc)
            continue
        if size != tuple(preprocess.img_size):
            image = resize_batch(image.float(), preprocess.img_size)
        yield arrays.name(index), image[0]


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


def stack_images(images: Sequence[torch.Tensor]) -> torch.Tensor:
    """One (B, C, H, W) batch: uint8 when every image is, else float32 (uint8 values kept)."""
    if all(image.dtype == torch.uint8 for image in images):
        return torch.stack(list(images))
    return torch.stack([image.float() for image in images])


def input_batch(images: Sequence[torch.Tensor], preprocess: Preprocess,
                like: torch.Tensor) -> torch.Tensor:
    """The model's input for (C, H, W) images at its size: stacked, normalised by
    `preprocess`, on the device and in the dtype of `like` (a parameter of the model)."""
    batch = preprocess.normalize(stack_images(images))
    return batch.to(device=like.device, dtype=like.dtype)


def run_batch(runner: torch.nn.Module, context: Callable[[], AbstractContextManager],
              batch: torch.Tensor) -> torch.Tensor:
    """The outputs of `runner` (the model in its precision, `in_precision`) on `batch`."""
    with torch.inference_mode(), context():
        return runner(batch)


def fill_predictions(rows: Sequence[Prediction], outputs: torch.Tensor, task: Task,
                     names: list[str] | None, k: int) -> None:
    """Put the outputs of a batch into its rows: top-k classes (`k` of them, `names` the
    class names), or the task's report."""
    if task.kind == "classification":
        top_p, top_i = outputs.float().softmax(dim=-1).topk(k, dim=-1)
        for row, p_row, i_row in zip(rows, top_p.tolist(), top_i.tolist(), strict=True):
            row.labels = [names[j] for j in i_row]
            row.indices, row.probs = i_row, p_row
        return
    for row, report in zip(rows, task.describe(outputs.float().cpu()), strict=True):
        row.task, row.report, row.names = task.kind, report, task.names


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
    if topk < 1:
        raise InputError(f"topk must be >= 1, got {topk}")
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    task = task_of(model)
    names = class_names_for(model) if task.kind == "classification" else None
    files = expand_inputs(inputs)
    preprocess = preprocess_for(model)
    param = next(model.parameters())
    k = min(topk, len(names)) if names else 0
    results: list[Prediction] = []
    inverted: list[str] = []
    requested = requested_precision(precision, int8)
    runner: torch.nn.Module | None = None
    was_training = model.training
    model.eval()
    try:
        for chunk in _chunks(read_inputs(files, preprocess), batch_size):
            rows = [Prediction(name, error=x if isinstance(x, str) else None)
                    for name, x in chunk]
            good = [i for i, (_, x) in enumerate(chunk) if isinstance(x, torch.Tensor)]
            if trained_on == "digits":
                inverted += [chunk[i][0] for i in good
                             if chunk[i][1].dtype == torch.uint8 and looks_inverted(chunk[i][1])]
            if good:
                batch = input_batch([chunk[i][1] for i in good], preprocess, param)
                if runner is None:
                    runner, context, _ = in_precision(model, requested, batch, int8,
                                                      precision is not None or int8 is not None)
                    runner = with_tta(runner, tta)
                fill_predictions([rows[i] for i in good], run_batch(runner, context, batch),
                                 task, names, k)
            results.extend(rows)
    finally:
        model.train(was_training)
    if inverted:
        listed = ", ".join(inverted[:3]) + (f" and {len(inverted) - 3} more"
                                            if len(inverted) > 3 else "")
        log.warning("warning: %d image(s) look like dark strokes on a light background (%s): "
                    "%s", len(inverted), listed, INVERTED_WARNING)
    return results


def in_precision(model: torch.nn.Module, requested: str | None, batch: torch.Tensor,
                 int8: str | None, say: bool
                 ) -> tuple[torch.nn.Module, Callable[[], AbstractContextManager], Precision]:
    """The model to run, the context to run it in and the `Precision` chosen for `batch`
    (logged when `say`); `vitkit serve` calls it once at start."""
    module, context, chosen = run_in_precision(
        requested, batch.device, model, batch if requested in ("auto", "int8") else None,
        int8_engine=int8)
    if say:
        log.info("%s", chosen.describe())
    return module, context, chosen


def _trained_on_words(data: str | None) -> str:
    return f"was trained on {data}" if data else "takes other images (not 8x8, one channel)"


def predict_files(weights: str | Path, inputs: Iterable[str | Path], topk: int = 5,
                  batch_size: int = 32, weights_dir: str | Path | None = None,
                  merge_tokens: int = 0, int8: str | None = None,
                  precision: str | None = None, tta: str | None = None) -> Predictions:
    """`predict` with weights any source `load_pretrained` reads, through the speed paths
    (`merge_tokens` per layer, then `precision`, `int8` an engine of
    `vitkit.inference.quantize`; `tta` as in `predict`, None: the training run's). A wrong path
    fails before the model loads. Weights a vitkit run trained on the embedded digits get a
    note on the input they expect (`INPUT_NOTE`)."""
    from vitkit.catalog import read_weights
    from vitkit.data.sources.digits import sample_digit
    from vitkit.inference.speedup import speed_up
    from vitkit.weights import build_model

    files = expand_inputs(inputs)
    requested_precision(precision, int8)  # a contradiction refused before the model loads
    record = read_weights(weights, weights_dir)
    model = speed_up(build_model(record), merge_tokens)
    trained_on = (record.train_config or {}).get("data")
    notes = [f"{INPUT_NOTE} (a sample: vitkit predict {weights} --sample)"] \
        if trained_on == "digits" else []
    digit_sized = record.config.in_chans == 1 and tuple(record.config.img_size) == (8, 8)
    if trained_on != "digits" and not digit_sized and sample_digit() in files:
        notes.append(f"the shipped sample (--sample) is an 8x8 digit, for models trained on "
                     f"the digits; {weights} {_trained_on_words(trained_on)}, so its "
                     "prediction for the sample says nothing about the model: give images of "
                     "its own kind")
    tta = recorded_tta(tta, record.eval_tta)
    warn_if_never_flipped(tta, record.train_config, record.preprocess.pictures)
    return Predictions(predict(model, files, topk=topk, batch_size=batch_size,
                               trained_on=trained_on, precision=precision, int8=int8,
                               tta=tta), notes)
