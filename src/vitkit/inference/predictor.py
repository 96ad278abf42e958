"""`Predictor`: a model ready for inference, the one object `vitkit predict`, `eval`, `serve`
and `benchmark` (its torch engine) build, and training evaluates through.

A weights record (or a live model) and the `InferenceOptions` (precision, int8 engine, tokens
merged per layer, test-time augmentation) become:

- `model`: the float model as loaded (explain's attention maps come from it: merged tokens
  have no grid, int8 has no attention weights to show);
- `runner`: what runs, composed in this order: token merging on a copy that shares the
  model's weights (`vitkit.inference.merging`), then the precision (`run_in_precision`:
  an int8 or bf16 copy, or autocast, with its `context`), then TTA (`with_tta`);
- `precision`: the `Precision` chosen, with its reason (`describe_precision`);
- `preprocess`, `task` (`vitkit.tasks.task_of`) and `names`, the names its output rows use
  (a classifier's `class_names_for`);
- `provenance`: what the weights' record says beyond the model (its file, format, the
  training run's recipe), for the verbs' reports.

`predictor(images)` takes a list of (C, H, W) images or a (B, C, H, W) batch (uint8 pictures
or float arrays, as the data gives them) and returns the (B, K) outputs: `inputs` stacks,
normalises and resizes them (`vitkit.data.transforms.resize_batch`) on the model's device and
dtype, then the runner runs in its context with gradients off, in eval mode (a live model's
own mode is restored after). `describe` and `predictions` give the task's rows.

`--precision auto` measures once: on `measure_batch` random images of the model's shape when
the predictor is built (serve, eval, benchmark), or with `measure_batch=None` on the first
batch predicted (predict).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from vitkit.data.classnames import imagenet_class_names
from vitkit.data.transforms import resize_batch, stack_images
from vitkit.errors import ConfigError
from vitkit.inference.precision import (
    MEASURE_BATCH,
    Precision,
    measurement_batch,
    requested_precision,
    run_in_precision,
)
from vitkit.inference.prediction import Prediction, check_topk, fill_predictions
from vitkit.inference.speedup import speed_up
from vitkit.inference.tta import check_tta, recorded_tta, warn_if_never_flipped, with_tta
from vitkit.preprocess import Preprocess, preprocess_for
from vitkit.tasks import Task, task_of

if TYPE_CHECKING:
    from vitkit.weights.record import WeightsRecord

__all__ = ["InferenceOptions", "Predictor", "Provenance", "class_names_for"]

log = logging.getLogger(__name__)
Context = Callable[[], contextlib.AbstractContextManager]


@dataclass(frozen=True)
class InferenceOptions:
    """How a model runs for inference. `precision`: fp32, bf16, int8 or auto (None: fp32, or
    int8 with `int8_engine`); `int8_engine`: an engine of `vitkit.inference.int8_engines` (or
    "auto"), which means int8, as `--int8 [--int8-engine E]` does; `merge_tokens`: tokens
    merged per layer (ToMe; 0: none); `tta`: none or flip (None: what the weights' training
    run evaluated with); `measure_batch`: the images `--precision auto` (and int8's engine
    choice) measures on, min(measure_batch, 8) random ones when the predictor is built, or
    None: the first batch predicted. A contradiction (`--int8` with another `--precision`) is
    refused here, before any model loads."""

    precision: str | None = None
    int8_engine: str | None = None
    merge_tokens: int = 0
    tta: str | None = None
    measure_batch: int | None = MEASURE_BATCH

    def __post_init__(self) -> None:
        requested_precision(self.precision, self.int8_engine)
        if self.tta is not None:
            check_tta(self.tta)

    @property
    def requested(self) -> str | None:
        """The precision asked for (`requested_precision`; None: the default, fp32)."""
        return requested_precision(self.precision, self.int8_engine)

    @property
    def asked(self) -> bool:
        """Whether a precision or an int8 engine was asked for (the verbs then log the
        choice and its reason)."""
        return self.precision is not None or self.int8_engine is not None

    @classmethod
    def given(cls, options: InferenceOptions | None, *, precision: str | None = None,
              int8: str | None = None, merge_tokens: int = 0, tta: str | None = None,
              measure_batch: int | None = MEASURE_BATCH) -> InferenceOptions:
        """`options`, or the options the loose keyword arguments of the verbs' functions
        name (`precision`, `int8`: an engine, `merge_tokens`, `tta`); both at once is
        refused. `measure_batch` is the verb's own and always applies."""
        if options is None:
            return cls(precision, int8, merge_tokens, tta, measure_batch)
        if (precision, int8, merge_tokens, tta) != (None, None, 0, None):
            raise ConfigError("give the inference options once: options=InferenceOptions(...) "
                              "or precision=, int8=, merge_tokens=, tta=, not both")
        return dataclasses.replace(options, measure_batch=measure_batch)


@dataclass(frozen=True)
class Provenance:
    """Where the weights come from, beyond what the model holds: `source` as given (a path, a
    checkpoint name, `hf-hub:`), the file read (`path`), its format (`origin`), raw or EMA
    weights (`weights_kind`), and for a training checkpoint the run's recipe
    (`train_config`) and the folder it trained in (`trained_in`)."""

    source: str | None = None
    path: Path | None = None
    origin: str | None = None
    weights_kind: str = "raw"
    train_config: dict[str, Any] | None = None
    trained_in: str | None = None

    @classmethod
    def of(cls, record: WeightsRecord, source: str | Path | None = None) -> Provenance:
        return cls(None if source is None else str(source), record.path, record.origin,
                   record.weights, record.train_config, record.trained_in)

    @property
    def trained_on(self) -> str | None:
        """The data the weights were trained on (`data=` of their run), when they say."""
        data = (self.train_config or {}).get("data")
        return data if isinstance(data, str) else None


def class_names_for(model: nn.Module) -> list[str]:
    """`model.class_names` (the checkpoint's), else ImageNet-1k/21k names by head size, else
    "class N". A head larger than the stored names (a 10-way head trained on 3 classes) keeps
    the names and calls the outputs past them "class N"."""
    num_classes = model.config.num_classes
    if num_classes <= 0:
        raise ConfigError("this model has no classification head (num_classes=0), so it "
                          "cannot predict classes; load weights that include a head, or "
                          "fine-tune one first")
    names = list(getattr(model, "class_names", None) or [])
    if 0 < len(names) <= num_classes:
        return names + [f"class {i}" for i in range(len(names), num_classes)]
    return imagenet_class_names(num_classes) or [f"class {i}" for i in range(num_classes)]


def sharing_weights(model: nn.Module) -> nn.Module:
    """A copy of `model`'s modules that shares its parameters and buffers (no tensor is
    copied): token merging changes the copy's classes, never the model's."""
    memo: dict[int, Any] = {id(t): t for t in (*model.parameters(), *model.buffers())}
    return copy.deepcopy(model, memo)


class Predictor:
    """A model ready for inference (see the module docstring). Build with `load`,
    `from_record` or `from_model`."""

    def __init__(self, model: nn.Module, options: InferenceOptions | None = None, *,
                 provenance: Provenance | None = None, preprocess: Preprocess | None = None,
                 context: Context | None = None, device: torch.device | None = None,
                 image_size: Sequence[int] | None = None, compiled: bool = False,
                 announce: bool | None = None) -> None:
        """`announce`: log the precision chosen (None: when one was asked for); `compiled`:
        the runner will be compiled by the caller (a bf16 copy's weights are then not
        prepacked). With `context` the model runs as it is inside it (a training run's
        autocast): no copy, no precision of its own, gradients off by `torch.no_grad`, the
        model's mode restored after each call."""
        self.options = options = options or InferenceOptions()
        self.model = model
        self.provenance = provenance or Provenance(origin=getattr(model, "origin", None),
                                                   weights_kind=getattr(model, "weights_kind",
                                                                        "raw"))
        self.preprocess = preprocess or preprocess_for(model)
        self.task: Task = task_of(model)
        self.device, self.compiled = device, compiled
        self.image_size = (int(image_size[0]), int(image_size[1])) \
            if image_size is not None else None
        self.announce = options.asked if announce is None else announce
        self.precision: Precision | None = None
        self.runner: nn.Module | None = None
        self.context: Context = context or contextlib.nullcontext
        self.live = context is not None
        if self.live and (options.requested is not None or options.merge_tokens):
            raise ConfigError("a predictor given a context runs the model as it is: leave "
                              "precision, int8_engine and merge_tokens out of its options")
        # the speed paths, in order: merged tokens (a copy), then the precision, then TTA
        merging = options.merge_tokens
        self.merged = speed_up(sharing_weights(model), merging) if merging else model
        self.tta = recorded_tta(options.tta, getattr(model, "eval_tta", "none"))
        if self.live:
            self.runner = with_tta(model, self.tta)
        elif options.measure_batch is not None:
            config = getattr(model, "config", None)
            channels = config.in_chans if config is not None else self.preprocess.channels
            self.prepare(measurement_batch(channels, self.model_size,
                                           options.measure_batch).to(self.parameter.device))
        warn_if_never_flipped(self.tta, self.provenance.train_config, self.preprocess.pictures)

    # -- building ---------------------------------------------------------------------------
    @classmethod
    def load(cls, source: str | Path, options: InferenceOptions | None = None,
             weights_dir: str | Path | None = None, **kwargs: Any) -> Predictor:
        """The weights any source `vitkit.catalog.read_weights` reads (a run folder, a file, a
        named checkpoint, `hf-hub:`), ready to run as `options` say (checked before the
        weights are read)."""
        from vitkit.catalog import read_weights

        return cls.from_record(read_weights(source, weights_dir), options, source=source,
                               **kwargs)

    @classmethod
    def from_record(cls, record: WeightsRecord, options: InferenceOptions | None = None, *,
                    source: str | Path | None = None, **kwargs: Any) -> Predictor:
        """The model `vitkit.weights.build_model` builds from `record`, ready to run as
        `options` say; `source`: how the weights were named."""
        from vitkit.weights import build_model

        return cls(build_model(record), options, provenance=Provenance.of(record, source),
                   **kwargs)

    @classmethod
    def from_model(cls, model: nn.Module, options: InferenceOptions | None = None, *,
                   context: Context | None = None, device: torch.device | None = None,
                   image_size: Sequence[int] | None = None, **kwargs: Any) -> Predictor:
        """A live `model` (kept as the float model), ready to run as `options` say. With
        `context` (training's evaluation: the run's autocast), the model itself runs inside
        it on `device` at `image_size` (None: the model's own), with no copy; `preprocess`
        (a keyword) replaces the model's own."""
        return cls(model, options, context=context, device=device, image_size=image_size,
                   **kwargs)

    def prepare(self, sample: torch.Tensor | None = None) -> None:
        """Choose the precision (auto and int8's engine by timing the merged model on
        `sample`, a batch of model inputs) and build the runner; logged when `announce`."""
        requested = self.options.requested
        training = self.model.training
        self.model.eval()  # the copies made here are of a model in eval mode
        try:
            module, self.context, self.precision = run_in_precision(
                requested, self.parameter.device, self.merged,
                sample if requested in ("auto", "int8") else None,
                int8_engine=self.options.int8_engine, compiled=self.compiled)
            self.runner = with_tta(module, self.tta).eval()
        finally:
            self.model.train(training)
        if self.announce:
            log.info("%s", self.describe_precision())

    # -- what it is -------------------------------------------------------------------------
    @property
    def parameter(self) -> torch.Tensor:
        """A parameter of the float model: where and in which dtype inputs go."""
        return next(self.model.parameters())

    @property
    def ready(self) -> bool:
        """Whether the runner is built (with `measure_batch=None`, at the first batch)."""
        return self.runner is not None

    @property
    def model_size(self) -> tuple[int, int]:
        """The (H, W) inputs are resized to: `image_size` as given, else the model's."""
        if self.image_size is not None:
            return self.image_size
        config = getattr(self.model, "config", None)
        return tuple(config.img_size) if config is not None else tuple(self.preprocess.img_size)

    @property
    def num_outputs(self) -> int | None:
        """The model's outputs per image (K of (B, K)), known before any batch (None: a
        module that does not say)."""
        config = getattr(self.model, "config", None)
        return config.num_classes if config is not None else None

    @functools.cached_property
    def names(self) -> list[str] | None:
        """The names output rows use: the task's output names (a classifier's are
        `class_names_for`'s; a model without a head has none, refused here)."""
        return self.task.row_names(lambda: class_names_for(self.model))

    def describe_precision(self) -> str:
        """"precision int8 (onednn) (why)": the choice and its reason, as the verbs log it."""
        if self.precision is None:
            return "precision: not chosen yet (the first batch measures)" if not self.live \
                else "precision: the caller's context"
        return self.precision.describe()

    # -- running ----------------------------------------------------------------------------
    def inputs(self, images: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """The model's input for `images` ((C, H, W) images or a (B, C, H, W) batch, uint8
        pictures or float arrays): stacked, normalised by `preprocess`, resized to the
        model's size when theirs differs (bilinear, antialiased when shrinking), on the
        model's device and in its dtype."""
        batch = images if isinstance(images, torch.Tensor) else stack_images(images)
        parameter = self.parameter
        batch = self.preprocess.normalize(batch.to(self.device or parameter.device))
        return resize_batch(batch, self.model_size).to(dtype=parameter.dtype)

    def run(self, batch: torch.Tensor) -> torch.Tensor:
        """The runner's (B, K) outputs on a batch of model inputs (`inputs`), built first
        from this batch when it is not yet (`prepare`)."""
        if self.runner is None:
            self.prepare(batch)
        training = self.model.training
        if training:
            self.model.eval()
        try:
            with (torch.no_grad() if self.live else torch.inference_mode()), self.context():
                return self.runner(batch)
        finally:
            if training:
                self.model.train()

    def __call__(self, images: Sequence[torch.Tensor] | torch.Tensor) -> torch.Tensor:
        """The (B, K) outputs on `images` (see `inputs`)."""
        return self.run(self.inputs(images))

    # -- what the outputs say -----------------------------------------------------------------
    def describe(self, outputs: torch.Tensor, topk: int = 5) -> list[dict[str, Any]]:
        """The task's report of each row of `outputs` (`Task.describe`: a classifier's `topk`
        classes under `names`)."""
        return self.task.describe(outputs, check_topk(topk), self.names)

    def predictions(self, paths: Sequence[str], outputs: torch.Tensor | Sequence[torch.Tensor],
                    topk: int = 5) -> list[Prediction]:
        """One `Prediction` per named input from its output row (`vitkit predict`'s rows)."""
        check_topk(topk)
        rows = [Prediction(path) for path in paths]
        if rows:
            stacked = outputs if isinstance(outputs, torch.Tensor) else torch.stack(list(outputs))
            fill_predictions(rows, stacked, self.task, self.names, topk)
        return rows
