"""What regression and multi-label classification share: K values (labels) per image, one
head output each. The head is sized to K; an evaluation collects every output and target
(gathered over ranks) and scores the whole set at once, as scikit-learn does; a prediction
is reported keyed by output name."""

from __future__ import annotations

import logging
from typing import Any

import torch

from vitkit.errors import ConfigError, DataError, first_few
from vitkit.tasks.base import (
    EvalResult,
    Ranks,
    Task,
    all_gather,
    check_channels,
    describe_targets,
    holds_class_labels,
)

log = logging.getLogger("vitkit.tasks")


def target_count(train: Any) -> int:
    """The targets (or labels) per image of regression or multi-label data: K of (N, K)."""
    labels = torch.as_tensor(train.labels)
    return int(labels.reshape(len(labels), -1).shape[1])


class GatheredOutputs:
    """The accumulator of tasks scored on the whole set: every output and target of this
    rank, joined with every other rank's (`all_gather`), then `Task.metrics` of them all."""

    def __init__(self, task: Task, where: str = "the held-out split") -> None:
        self.task, self.where = task, where
        self.outputs: list[torch.Tensor] = []
        self.targets: list[torch.Tensor] = []
        self.joined: tuple[torch.Tensor, torch.Tensor] | None = None

    def update(self, outputs: torch.Tensor, targets: torch.Tensor) -> None:
        self.outputs.append(outputs.float().cpu())
        self.targets.append(targets.reshape(len(targets), -1).float().cpu())

    def _mine(self) -> tuple[torch.Tensor, torch.Tensor]:
        return (torch.cat(self.outputs) if self.outputs else torch.zeros(0, 0),
                torch.cat(self.targets) if self.targets else torch.zeros(0, 0))

    def sync(self, ranks: Ranks) -> None:
        mine = self._mine()
        if not ranks.enabled:
            self.joined = mine
            return
        kept = [part for part in all_gather(mine, ranks) if len(part[0])]
        self.joined = (torch.cat([p[0] for p in kept]), torch.cat([p[1] for p in kept])) \
            if kept else mine

    def compute(self, interrupted: bool = False) -> EvalResult:
        outputs, targets = self.joined if self.joined is not None else self._mine()
        primary = self.task.primary_metric
        if not len(outputs):
            if interrupted:
                return EvalResult({}, 0, primary, interrupted=True)
            raise DataError(f"{self.where} holds no images to evaluate")
        return EvalResult(self.task.metrics(outputs, targets), len(outputs), primary,
                          interrupted, outputs=outputs)


class PerOutputTask(Task):
    """The shared half of regression and multi-label classification."""

    model_words = ""  # the model in a refusal: "a regression model"
    target_words = ""  # what each image needs: "float target(s)"
    integer_words = ""  # what integer array targets are scored as: "values"
    sources_words = ""  # the sources that give such targets
    linear_probe = ""  # the frozen-feature probe of its targets (`vitkit.evaluation.probe`)
    probe_regularisation = ""  # the name of that probe's regularisation in its report
    knn_words = ""  # what its targets are, where kNN (which votes classes) is not run

    # -- training ---------------------------------------------------------------------------
    def check_augment(self, augment: Any) -> None:
        if augment.label_smoothing:
            raise ConfigError(f"augment.label_smoothing={augment.label_smoothing} is for "
                              f"classification (it softens one-hot class targets); task="
                              f"{self.kind} has {self.outputs_word} to fit as they are: drop "
                              "augment.label_smoothing (or set it to 0)")

    def output_count(self, train: Any, test: Any = None) -> int:
        """Targets (labels) per image."""
        return target_count(train)

    def size_head(self, cfg: Any, config: Any, train: Any, test: Any = None) -> Any:
        """One output per target (label), K of the (N, K) targets, as a folder's classes size
        a classification head. A conflicting `model.num_classes` is refused; fine-tuning
        replaces the head (`init_from`)."""
        found = target_count(train)
        self.warn_of_training_targets(train, cfg.data_dir or cfg.data)
        if cfg.init_from or config.num_classes == found:
            return config
        word = self.outputs_word
        if isinstance(cfg.model, dict) and "num_classes" in cfg.model:
            names = self.names or [str(i) for i in range(found)]
            raise ConfigError(f"model.num_classes={config.num_classes} but task={self.kind} on "
                              f"{cfg.data_dir or cfg.data} has {found} {word} per image "
                              f"({first_few(names)}): "
                              f"set model.num_classes={found} (or leave model.num_classes "
                              "unset, and the head is sized from the data)")
        log.info("task=%s: %d %s per image, the head has %d outputs", self.kind, found, word,
                 found)
        return config.replace(num_classes=found)

    def warn_of_training_targets(self, train: Any, where: str) -> None:
        """Say what the training targets of `where` will not teach."""

    def check_training_labels(self, num_outputs: int, train: Any) -> None:
        count = target_count(train)
        if count != num_outputs:
            raise DataError(f"the data has {count} {self.outputs_word} per image but the "
                            f"head has {num_outputs} outputs: set model.num_classes={count}")

    # -- evaluation -------------------------------------------------------------------------
    def accumulator(self, num_outputs: int | None = None,
                    where: str = "the held-out split") -> GatheredOutputs:
        return GatheredOutputs(self, where)

    def check_eval_data(self, dataset: Any, num_outputs: int, in_chans: int,
                        data: str) -> None:
        """The split's targets must be K values (labels) per image, K the model's outputs.
        Class labels (integer (N,)) of a classification source are refused; integer targets
        of arrays may be values (counts), so they are scored, with a warning."""
        check_channels(dataset, in_chans, data)
        labels = dataset.labels
        if labels is None:
            raise DataError(f"{data} is streamed and its targets are known only as it is "
                            f"read: task={self.kind} weights are evaluated on data held in "
                            "memory")
        if holds_class_labels(labels):
            if data != "arrays":
                raise DataError(f"{data} has {describe_targets(labels)} but the model is "
                                f"{self.model_words} (task={self.kind}, {num_outputs} "
                                f"output(s)): evaluate on data with {num_outputs} "
                                f"{self.target_words} per image: {self.sources_words}")
            log.warning("warning: the arrays' targets are integers (shape %s): they are scored "
                        "as %s; if they are class labels, evaluate on data of the model's task",
                        tuple(labels.shape), self.integer_words)
        labels = labels.reshape(len(labels), -1)
        word = self.outputs_word
        if labels.shape[1] != num_outputs:
            raise DataError(f"{data} has {labels.shape[1]} {word} per image but the model "
                            f"predicts {num_outputs} (task={self.kind}): evaluate on data with "
                            f"{num_outputs} {word} per image")
        self.check_eval_values(labels, data)

    def check_eval_values(self, labels: torch.Tensor, data: str) -> None:
        """Refuse (N, K) held-out targets of values the task cannot score."""

    def probe_lines(self, metrics: dict[str, Any], regularisation: float,
                    grid: str) -> list[str]:
        """The frozen-feature probe's lines: the `grid` searched, the test `metrics`."""
        raise NotImplementedError

    def eval_report(self, result: EvalResult, head: dict[str, Any], names: list[str],
                    output_map: torch.Tensor | None = None) -> dict[str, Any]:
        """The task's metrics of the whole split, test_loss as "loss"."""
        metrics = result.metrics
        return {**head, "task": self.kind, "images": result.count,
                "loss": metrics["test_loss"],
                **{k: v for k, v in metrics.items() if k != "test_loss"}}
