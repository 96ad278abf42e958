"""`Prediction`: what a model says of one input, or why the input could not be read; the row
`vitkit predict` prints and `vitkit serve` answers with (`to_dict` is their JSON object).

What a row holds is the model's task's (`vitkit.tasks`): the task describes a batch of outputs
(`Task.describe`) and fills each row from its report (`Task.fill_row`); the row's JSON and its
line of text are the task's too (`Task.row_json`, `Task.row_text`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from vitkit.errors import InputError
from vitkit.tasks import Task, make_task

__all__ = ["Prediction", "check_topk", "fill_predictions"]


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
        return {"path": self.path, **make_task(self.task).row_json(self)}

    def format(self) -> str:
        """One line: "path: label (12.34%), ..." (classification and multi-label),
        "path: name=value, ..." (regression) or "path: error: ..."."""
        if self.error is not None:
            return f"{self.path}: error: {self.error}"
        return f"{self.path}: {make_task(self.task).row_text(self)}"


def check_topk(topk: int) -> int:
    """`topk` if it is at least 1, else an InputError saying so."""
    if topk < 1:
        raise InputError(f"topk must be >= 1, got {topk}")
    return topk


def fill_predictions(rows: Sequence[Prediction], outputs: torch.Tensor, task: Task,
                     names: list[str] | None, topk: int) -> None:
    """Put the outputs of a batch into its rows, as the task describes them (`Task.describe`:
    a classifier's `topk` classes under `names`, capped at the class count)."""
    for row, report in zip(rows, task.describe(outputs, topk, names), strict=True):
        task.fill_row(row, report)
