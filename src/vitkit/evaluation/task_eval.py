"""The evaluation loop of regression and multi-label models: every output and target of the
held-out split collected (gathered over ranks under DDP), then the task's whole-set metrics
(`vitkit.tasks`: regression mae / rmse / r2 and per output; multi-label map / f1 and per
label, each as scikit-learn computes it). Classification keeps its own counting loop
(`vitkit.evaluation.classify`), and `evaluate_for_task` picks between the two."""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist

from vitkit.data.augment import resize_batch
from vitkit.data.feeds import EvaluationFeed, eval_batches
from vitkit.errors import DataError
from vitkit.evaluation.classify import EvalResult, Ranks, SingleProcess, evaluate
from vitkit.preprocess import Preprocess
from vitkit.tasks import Task


@dataclass
class TaskEvalResult:
    """A regression or multi-label evaluation: `metrics` is `Task.metrics` of the whole split
    (test_loss, the task's scalars, per_output / per_label); `count` images."""

    metrics: dict[str, Any]
    count: int
    primary: str  # the metric best.pt is chosen by (r2, map)
    interrupted: bool = False
    outputs: torch.Tensor | None = field(default=None, repr=False)  # (N, K) raw model outputs

    @property
    def score(self) -> float:
        return float(self.metrics[self.primary])

    def as_dict(self) -> dict[str, float]:
        """The scalar metrics (a metrics.csv row's columns): test_loss and the task's."""
        return {key: float(value) for key, value in self.metrics.items()
                if isinstance(value, int | float)}


@torch.no_grad()
def evaluate_task(model: torch.nn.Module, dataset: EvaluationFeed, task: Task,
                  preprocess: Preprocess, batch_size: int = 500,
                  device: torch.device | None = None, info: Ranks | None = None,
                  context: Callable[[], contextlib.AbstractContextManager] | None = None,
                  image_size: tuple[int, int] | None = None,
                  should_stop: Callable[[], bool] | None = None) -> TaskEvalResult:
    """Evaluate on this rank's share of `dataset`, gather every rank's outputs and targets,
    and score them with `task.metrics` (decoded outputs against raw targets). Images are
    normalised, resized and run in `context()` as `vitkit.evaluation.classify.evaluate`
    does; `should_stop` is asked before each batch in a single process."""
    info = info or SingleProcess()
    device = device or torch.device("cpu")
    was_training = model.training
    model.eval()
    outputs, targets = [], []
    interrupted = False
    for images, labels in eval_batches(dataset, batch_size, info.rank, info.world_size):
        if should_stop is not None and not info.enabled and should_stop():
            interrupted = True
            break
        x = resize_batch(preprocess.normalize(images.to(device)), image_size)
        with (context or contextlib.nullcontext)():
            out = model(x)
        outputs.append(out.float().cpu())
        targets.append(labels.reshape(len(labels), -1).float().cpu())
    model.train(was_training)
    outputs_all, targets_all = _gather(outputs, targets, info)
    if not len(outputs_all):
        if interrupted:
            return TaskEvalResult({}, 0, task.primary_metric, interrupted=True)
        raise DataError(f"{dataset.name or 'the held-out split'} holds no images to evaluate")
    metrics = task.metrics(outputs_all, targets_all)
    return TaskEvalResult(metrics, len(outputs_all), task.primary_metric, interrupted,
                          outputs_all)


def _gather(outputs: list[torch.Tensor], targets: list[torch.Tensor], info: Ranks
            ) -> tuple[torch.Tensor, torch.Tensor]:
    """This rank's outputs and targets, joined with every other rank's (under DDP)."""
    mine = (torch.cat(outputs) if outputs else torch.zeros(0, 0),
            torch.cat(targets) if targets else torch.zeros(0, 0))
    if not info.enabled:
        return mine
    parts: list[Any] = [None] * info.world_size
    dist.all_gather_object(parts, mine)
    kept = [part for part in parts if len(part[0])]
    if not kept:
        return mine
    return torch.cat([p[0] for p in kept]), torch.cat([p[1] for p in kept])


def evaluate_for_task(model: torch.nn.Module, dataset: EvaluationFeed, task: Task,
                      num_outputs: int, preprocess: Preprocess, batch_size: int = 500,
                      device: torch.device | None = None, info: Ranks | None = None,
                      context: Callable[[], contextlib.AbstractContextManager] | None = None,
                      image_size: tuple[int, int] | None = None,
                      should_stop: Callable[[], bool] | None = None
                      ) -> EvalResult | TaskEvalResult:
    """The task's evaluation: classification's counting loop (top-1, top-5, confusion), or
    the collected outputs scored by the task. Either result has `as_dict()` (the scalar
    metrics of a metrics row), `score` (the primary metric) and `interrupted`."""
    if task.kind == "classification":
        return evaluate(model, dataset, num_outputs, preprocess, batch_size, device, info,
                        context, image_size, should_stop)
    return evaluate_task(model, dataset, task, preprocess, batch_size, device, info,
                         context, image_size, should_stop)
