"""What every task has: the `Task` interface (one subclass per task owns its loss, metrics,
checks, words and reports), the one `EvalResult` an evaluation gives, and how a metric
accumulator combines the ranks of a distributed run (`Ranks`, `all_reduce_sum`,
`all_gather`)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
import torch.distributed as dist

from vitkit.errors import DataError
from vitkit.tasks.spec import TaskSpec


# -- ranks --------------------------------------------------------------------------------------
class Ranks(Protocol):
    """This process's place among the ranks (`vitkit.train.distributed.DistInfo` is one)."""

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...

    @property
    def enabled(self) -> bool: ...


@dataclass(frozen=True)
class SingleProcess:
    """One process: nothing to combine."""

    rank: int = 0
    world_size: int = 1
    enabled: bool = False


def all_reduce_sum(tensor: torch.Tensor, info: Ranks) -> torch.Tensor:
    """Sum a tensor over ranks (in place); a no-op in a single process."""
    if info.enabled:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def all_gather(value: Any, info: Ranks) -> list[Any]:
    """Every rank's `value`, in rank order (`[value]` in a single process)."""
    if not info.enabled:
        return [value]
    parts: list[Any] = [None] * info.world_size
    dist.all_gather_object(parts, value)
    return parts


# -- results ------------------------------------------------------------------------------------
@dataclass
class EvalResult:
    """One evaluation of any task. `metrics`: test_loss and the task's scalars (top1 / top5,
    mae / rmse / r2, map / f1), with per_output / per_label where the task has them; `count`
    images; `primary` the metric best.pt is chosen by; `interrupted`: `should_stop` ended it
    early, so the metrics cover part of the data. Classification keeps its `confusion`
    matrix (rows: true class, columns: prediction), the other tasks their raw `outputs`."""

    metrics: dict[str, Any]
    count: int
    primary: str
    interrupted: bool = False
    confusion: torch.Tensor | None = field(default=None, repr=False)
    outputs: torch.Tensor | None = field(default=None, repr=False)  # (N, K) raw model outputs

    @property
    def score(self) -> float:
        """The primary metric (top-1, R^2 or mAP): higher is better."""
        return float(self.metrics[self.primary])

    @property
    def per_class(self) -> torch.Tensor | None:
        """Each class's accuracy (None without a confusion matrix)."""
        if self.confusion is None:
            return None
        totals = self.confusion.sum(1).clamp(min=1)
        return self.confusion.diag() / totals

    def as_dict(self) -> dict[str, float]:
        """The scalar metrics (a metrics.csv row's columns): test_loss and the task's."""
        return {key: float(value) for key, value in self.metrics.items()
                if isinstance(value, int | float)}


class Accumulator(Protocol):
    """A task's metrics, built batch by batch: `update` with each batch's outputs and targets,
    `sync` once over the ranks (every rank calls it), then `compute` the result."""

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None: ...

    def sync(self, ranks: Ranks) -> None: ...

    def compute(self, interrupted: bool = False) -> EvalResult: ...


# -- helpers of several tasks ---------------------------------------------------------------------
def value_names(names: Sequence[str] | None, count: int) -> list[str]:
    """How per-output values are shown: the stored names, else "value" (one output) or
    "value[j]"."""
    if names and len(names) >= count:
        return list(names[:count])
    return ["value"] if count == 1 else [f"value[{j}]" for j in range(count)]


def holds_class_labels(labels: torch.Tensor) -> bool:
    """Whether a split's targets are (N,) integer class indices, as every source delivers
    class labels (regression and multi-label targets come as float (N, K))."""
    return labels.ndim == 1 and not labels.is_floating_point()


def describe_targets(labels: torch.Tensor) -> str:
    """A split's targets in words, for a message: integer class labels, or float / 0/1
    targets of their shape."""
    if holds_class_labels(labels):
        return f"integer class labels (shape {tuple(labels.shape)})"
    shape = tuple(labels.shape)
    if labels.ndim == 2 and labels.shape[1] > 1 and bool(((labels == 0) | (labels == 1)).all()):
        return f"0/1 multi-label targets of shape {shape}"
    return f"float targets of shape {shape}"


def check_channels(dataset: Any, in_chans: int, data: str) -> None:
    """Refuse images of other channels than the model takes."""
    if dataset.channels != in_chans:
        raise DataError(f"the {data} images have {dataset.channels} channel(s) but the model "
                        f"takes {in_chans}: evaluate on data with {in_chans} channel(s)")


# -- the interface ------------------------------------------------------------------------------
class Task:
    """The behaviour every task has; one subclass per task fills it in. Callers never ask
    which task it is: they call these methods."""

    kind: str = ""
    primary_metric: str = ""  # what "better" means for best.pt: higher wins
    outputs_word = ""  # its outputs in a message: "class(es)", "target(s)", "label(s)"
    outputs_plural = ""  # the frozen-feature reports' count: "classes", "target(s)", "labels"
    class_labels = False  # its targets are one class index per image (folders of classes)
    sampled_words = "at random"  # how explain samples a data set's test images
    onnx_output = "logits"  # the exported graph's output name
    onnx_meaning = ""  # what that output is, in the graph's metadata
    onnx_note: str | None = None  # a line `vitkit export` prints on the output, if any

    def __init__(self, spec: TaskSpec) -> None:
        self.spec = spec

    @property
    def names(self) -> list[str] | None:
        return self.spec.names

    def better(self, score: float, best: float | None) -> bool:
        """Whether `score` (of the primary metric) beats `best` (None: nothing yet)."""
        return best is None or score > best

    def output_name(self, index: int) -> str:
        names = self.names
        return names[index] if names and index < len(names) else str(index)

    # -- training ---------------------------------------------------------------------------
    def training_targets(self, labels: torch.Tensor, num_outputs: int,
                         label_smoothing: float = 0.0) -> torch.Tensor:
        """The float (B, num_outputs) targets the loss compares outputs with (what Mixup
        mixes)."""
        raise NotImplementedError

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Mean loss of float outputs (B, K) against `training_targets` (B, K)."""
        raise NotImplementedError

    def check_augment(self, augment: Any) -> None:
        """Refuse an augmentation (an `AugmentConfig`) the task cannot train with."""

    def adjust_augment(self, augment: Any, cfg: Any, streamed: bool,
                       float_images: bool) -> Any:
        """The augmentation (an `AugmentConfig`) the task trains with, from the run's
        (`cfg`, a `TrainConfig`; `streamed` data, `float_images` arrays)."""
        return augment

    def output_count(self, train: Any, test: Any = None) -> int:
        """Outputs of a new head for the training records `train` (and held-out `test`)."""
        raise NotImplementedError

    def size_head(self, cfg: Any, config: Any, train: Any, test: Any = None) -> Any:
        """The model config (`config`, a ViTConfig) of a fresh run of `cfg` (a TrainConfig)
        with its head sized to the data."""
        raise NotImplementedError

    def check_training_labels(self, num_outputs: int, train: Any) -> None:
        """Refuse training targets a head of `num_outputs` cannot fit, naming the fix."""
        raise NotImplementedError

    def check_held_out(self, labels: Any, where: str) -> None:
        """Refuse held-out targets (an array) the task cannot score, naming the fix."""

    # -- evaluation -------------------------------------------------------------------------
    def metrics(self, outputs: torch.Tensor, targets: torch.Tensor) -> dict[str, Any]:
        """The task's metrics of a whole set: decoded outputs vs raw targets."""
        raise NotImplementedError

    def accumulator(self, num_outputs: int | None = None,
                    where: str = "the held-out split") -> Accumulator:
        """A fresh accumulator of the task's metrics over a model's `num_outputs` outputs
        (None: read from the first batch); `where` names the data in messages."""
        raise NotImplementedError

    def check_eval_data(self, dataset: Any, num_outputs: int, in_chans: int,
                        data: str) -> None:
        """Refuse an evaluation feed the model cannot be scored on, naming the fix."""
        raise NotImplementedError

    def check_feature_data(self, dataset: Any, data: str) -> None:
        """Refuse a split whose targets frozen-feature protocols cannot read."""

    def output_map(self, data_classes: list[str], model_classes: list[str] | None,
                   data: str) -> torch.Tensor | None:
        """The model's output for each of the data's targets (None: the same index)."""
        return None

    def eval_report(self, result: EvalResult, head: dict[str, Any], names: list[str],
                    output_map: torch.Tensor | None = None) -> dict[str, Any]:
        """`vitkit eval`'s JSON report: `head` (what was evaluated how) and the result;
        `names`: the outputs' names."""
        raise NotImplementedError

    def eval_lines(self, report: dict[str, Any], title: str, num_outputs: int) -> list[str]:
        """The printed lines of `vitkit eval`'s `report`, the first starting with `title`."""
        raise NotImplementedError

    def primary_words(self, score: float) -> str:
        """The primary metric's value in words: "top-1 87.74%", "R^2 0.9312"."""
        raise NotImplementedError

    def metric_text(self, score: float) -> str:
        """The primary metric's value, short: "87.74%", "r2 0.9312"."""
        return f"{self.primary_metric} {score:.4f}"

    def epoch_words(self, row: dict[str, float], num_outputs: int) -> str:
        """A metrics row in the training log's words: "test top-1 87.74%  top-5 99.00%"."""
        raise NotImplementedError

    def final_words(self, row: dict[str, float], num_outputs: int) -> str:
        """A metrics row in the words of `vitkit train`'s last line."""
        return self.epoch_words(row, num_outputs)

    # -- outputs ----------------------------------------------------------------------------
    def decode(self, outputs: torch.Tensor) -> torch.Tensor:
        """Model outputs -> what they mean: class probabilities, values in the targets' units,
        or label probabilities."""
        raise NotImplementedError

    def describe(self, outputs: torch.Tensor, top_k: int = 5,
                 names: Sequence[str] | None = None) -> list[dict[str, Any]]:
        """One JSON-ready report per image of a batch of model outputs (detached: reporting
        never joins a graph). `names`: the outputs' names (None: the task's)."""
        raise NotImplementedError

    def row_names(self, class_names: Callable[[], list[str]]) -> list[str] | None:
        """The names prediction rows use: the task's output names (`class_names()` gives a
        classifier's, with its fallbacks)."""
        return self.names

    def fill_row(self, row: Any, report: dict[str, Any]) -> None:
        """Put one image's `describe` report into a prediction row
        (`vitkit.inference.prediction.Prediction`)."""
        row.task, row.report, row.names = self.kind, report, self.names

    def row_json(self, row: Any) -> dict[str, Any]:
        """A prediction row's JSON fields, after its "path"."""
        raise NotImplementedError

    def row_text(self, row: Any) -> str:
        """A prediction row in words, after "path: "."""
        raise NotImplementedError

    def title_words(self, outputs: torch.Tensor, class_names: Sequence[str] | None,
                    num_classes: int) -> str | None:
        """One image's outputs (K,) as a figure title says them (None: nothing to say)."""
        raise NotImplementedError

    def target_text(self, row: torch.Tensor, classes: list[str]) -> str:
        """A test image's targets in words: "temperature=3.2"."""
        values = row.reshape(-1).tolist()
        names = self.names or classes or None
        return ", ".join(f"{name}={value:.4g}" for name, value in
                         zip(value_names(names, len(values)), values, strict=True))

    def output_scaling(self, num_outputs: int) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(scale, shift) an exported graph applies to the outputs (None: none)."""
        return None

    def agreement_words(self, agreement: float) -> str:
        """The int8 check's agreement with the float model, where the task has one to say."""
        return ""
