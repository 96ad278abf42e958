"""Classify image files with a model, using the checkpoint's own preprocessing and class names.

Folders are searched recursively for images (sorted); a file reached twice (named twice, or
through a folder and by name) is predicted once; files run in batches. A file Pillow cannot
decode gets a `Prediction` with `error` set and does not stop the others.

Weights trained on the embedded digits (a vitkit run with data=digits) expect light strokes on
a black background: the report says so, and an image that looks dark on light is warned about.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from vitkit.data.classnames import imagenet_class_names
from vitkit.data.images import decode_image
from vitkit.data.sources.digits import INPUT_NOTE, INVERTED_WARNING, looks_inverted
from vitkit.data.sources.folder import IMAGE_EXTENSIONS
from vitkit.errors import ConfigError, InputError
from vitkit.model.vit import VisionTransformer
from vitkit.preprocess import Preprocess, preprocess_for

__all__ = ["Prediction", "Predictions", "class_names_for", "expand_inputs", "predict",
           "predict_files"]

log = logging.getLogger(__name__)


@dataclass
class Prediction:
    """Top-k classes of one image (most probable first), or why it could not be read."""

    path: str
    labels: list[str] = field(default_factory=list)
    indices: list[int] = field(default_factory=list)
    probs: list[float] = field(default_factory=list)
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    def to_dict(self) -> dict[str, Any]:
        """{"path", "topk": [{"label", "index", "prob"}, ...]} or {"path", "error"}."""
        if self.error is not None:
            return {"path": self.path, "error": self.error}
        return {"path": self.path, "topk": [
            {"label": label, "index": index, "prob": prob}
            for label, index, prob in zip(self.labels, self.indices, self.probs, strict=True)]}

    def format(self) -> str:
        """One line: "path: label (12.34%), ..." or "path: error: ..."."""
        if self.error is not None:
            return f"{self.path}: error: {self.error}"
        top = ", ".join(f"{label} ({100 * prob:.2f}%)"
                        for label, prob in zip(self.labels, self.probs, strict=True))
        return f"{self.path}: {top}"


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

    def format(self) -> str:
        return "\n".join([*(result.format() for result in self.results),
                          *(f"note: {note}" for note in self.notes)])

    def to_dict(self) -> dict[str, Any]:
        notes = {"notes": self.notes} if self.notes else {}
        return {"predictions": [result.to_dict() for result in self.results], **notes}

    def json_lines(self) -> str:
        """One JSON object per file and line (`vitkit predict --json`)."""
        return "\n".join(json.dumps(result.to_dict()) for result in self.results)


def expand_inputs(inputs: Iterable[str | Path]) -> list[Path]:
    """Files as given; folders replaced by their image files (recursive, sorted, no hidden).

    Each file appears once, where it is first reached (paths are compared resolved)."""
    files: list[Path] = []
    for item in inputs:
        path = Path(item).expanduser()
        if not path.exists():
            raise InputError(f"{path} does not exist; pass image files or folders of images")
        if not path.is_dir():
            files.append(path)
            continue
        found = sorted(p for p in path.rglob("*")
                       if p.suffix.lower() in IMAGE_EXTENSIONS and p.is_file()
                       and not any(part.startswith(".") for part in p.relative_to(path).parts))
        if not found:
            raise InputError(f"folder {path} holds no images (looked for "
                             f"{', '.join(sorted(IMAGE_EXTENSIONS))}); pass a folder with "
                             f"images or the image files themselves")
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
    """(C, H, W) uint8 tensor of one file, or a short reason it could not be read."""
    decoded = decode_image(path, preprocess.channels)
    if decoded.image is None:
        return f"cannot read image ({decoded.reason}); {decoded.fix}"
    return preprocess.to_uint8(decoded.image)


def _chunks(items: Sequence[Path], size: int) -> Iterable[Sequence[Path]]:
    for start in range(0, len(items), size):
        yield items[start:start + size]


def predict(model: VisionTransformer, inputs: Iterable[str | Path], topk: int = 5,
            batch_size: int = 32, trained_on: str | None = None) -> list[Prediction]:
    """Top-k softmax predictions for image files and folders, one `Prediction` per file.

    Images go through `model.preprocess` (the official squash-resize to [-1, 1] when the
    model has none) on the model's device and dtype. `topk` is capped at the class count.
    `trained_on`: the data the weights were trained on (a vitkit run's `data`); for
    "digits", images that look dark on light get a warning (`INVERTED_WARNING`).
    """
    if topk < 1:
        raise InputError(f"topk must be >= 1, got {topk}")
    if batch_size < 1:
        raise InputError(f"batch_size must be >= 1, got {batch_size}")
    names = class_names_for(model)
    files = expand_inputs(inputs)
    preprocess = preprocess_for(model)
    param = next(model.parameters())
    k = min(topk, len(names))
    results: list[Prediction] = []
    inverted: list[str] = []
    was_training = model.training
    model.eval()
    try:
        for chunk in _chunks(files, batch_size):
            decoded = [_open(path, preprocess) for path in chunk]
            rows = [Prediction(str(path), error=x if isinstance(x, str) else None)
                    for path, x in zip(chunk, decoded, strict=True)]
            good = [i for i, x in enumerate(decoded) if isinstance(x, torch.Tensor)]
            if trained_on == "digits":
                inverted += [str(chunk[i]) for i in good if looks_inverted(decoded[i])]
            if good:
                batch = preprocess.normalize(torch.stack([decoded[i] for i in good]))
                with torch.inference_mode():
                    logits = model(batch.to(device=param.device, dtype=param.dtype))
                    top_p, top_i = logits.float().softmax(dim=-1).topk(k, dim=-1)
                for i, p_row, i_row in zip(good, top_p.tolist(), top_i.tolist(), strict=True):
                    rows[i].labels = [names[j] for j in i_row]
                    rows[i].indices, rows[i].probs = i_row, p_row
            results.extend(rows)
    finally:
        model.train(was_training)
    if inverted:
        listed = ", ".join(inverted[:3]) + (f" and {len(inverted) - 3} more"
                                            if len(inverted) > 3 else "")
        log.warning("warning: %d image(s) look like dark strokes on a light background (%s): "
                    "%s", len(inverted), listed, INVERTED_WARNING)
    return results


def predict_files(weights: str | Path, inputs: Iterable[str | Path], topk: int = 5,
                  batch_size: int = 32, weights_dir: str | Path | None = None,
                  merge_tokens: int = 0, int8: str | None = None) -> Predictions:
    """`predict` with weights any source `load_pretrained` reads, through the speed paths
    (`merge_tokens` per layer, `int8` an engine of `vitkit.inference.quantize`). A wrong path
    fails before the model loads. Weights a vitkit run trained on the embedded digits get a
    note on the input they expect (`INPUT_NOTE`)."""
    from vitkit.catalog import read_weights
    from vitkit.inference.speedup import speed_up
    from vitkit.weights import build_model

    files = expand_inputs(inputs)
    record = read_weights(weights, weights_dir)
    model = speed_up(build_model(record), merge_tokens, int8)
    trained_on = (record.train_config or {}).get("data")
    notes = [f"{INPUT_NOTE} (a sample: vitkit predict {weights} --sample)"] \
        if trained_on == "digits" else []
    return Predictions(predict(model, files, topk=topk, batch_size=batch_size,
                               trained_on=trained_on), notes)
