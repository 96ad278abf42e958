"""What a set of weights was trained for, as a file stores it (`TaskSpec`: the task's name,
its output names, its loss and the regression targets' standardisation), and the losses each
task takes, with the other names people give them."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from vitkit.errors import ConfigError
from vitkit.fieldtypes import check_known_keys, did_you_mean

log = logging.getLogger("vitkit.tasks")

TASKS = ("classification", "regression", "multilabel")
LOSSES = {"classification": ("cross_entropy",), "regression": ("mse", "huber", "l1"),
          "multilabel": ("bce",)}
# What each loss is, named beside a suggestion. "huber" is F.huber_loss at its default delta 1
# (on the standardised targets): torch's HuberLoss(delta) is delta x SmoothL1Loss(beta=delta),
# so at 1 the two are the same loss.
LOSS_MEANINGS = {"cross_entropy": "softmax cross-entropy", "mse": "mean squared error",
                 "huber": "Huber loss with delta 1 on the standardised targets, the same as "
                          "smooth L1 with beta 1",
                 "l1": "mean absolute error", "bce": "binary cross-entropy with logits"}
# Other common names of the losses (compared after `_loss_key`): suggested with what they mean,
# never accepted in their place, so a config names one loss one way.
LOSS_ALIASES = {"mae": "l1", "mean_absolute_error": "l1", "l2": "mse",
                "mean_squared_error": "mse", "smooth_l1": "huber", "smoothl1": "huber",
                "ce": "cross_entropy", "crossentropy": "cross_entropy",
                "softmax": "cross_entropy", "softmax_cross_entropy": "cross_entropy",
                "bce_with_logits": "bce", "bcewithlogits": "bce",
                "binary_cross_entropy": "bce", "binary_crossentropy": "bce"}
# Tasks whose outputs are reported keyed by name (a class list may repeat a name: ImageNet's).
KEYED_BY_NAME = ("regression", "multilabel")


@dataclass
class TaskSpec:
    """What a set of weights was trained for, as stored beside them.

    `names` names the outputs: class names, target names or label names (None: unnamed).
    `target_mean` / `target_std` (regression only): the training targets' per-output mean and
    std; the head predicts `(y - mean) / std`.
    """

    kind: str = "classification"
    names: list[str] | None = None
    loss: str | None = None
    target_mean: list[float] | None = None
    target_std: list[float] | None = None

    def __post_init__(self) -> None:
        if self.kind not in TASKS:
            raise ConfigError(f"task={self.kind!r} is not one of {', '.join(TASKS)}")
        if self.loss is None:
            self.loss = LOSSES[self.kind][0]
        if self.loss not in LOSSES[self.kind]:
            allowed = ", ".join(LOSSES[self.kind])
            raise ConfigError(f"loss={self.loss!r} does not apply to task={self.kind} "
                              f"(it takes {allowed})."
                              + loss_suggestion(self.loss, LOSSES[self.kind]))
        if self.names is not None:
            self.names = [str(n) for n in self.names]
            repeated = _repeated(self.names) if self.kind in KEYED_BY_NAME else []
            if repeated:  # its outputs are reported keyed by name (a class list is not)
                raise ConfigError(
                    f"the output names of a {self.kind} task repeat "
                    f"({', '.join(repr(n) for n in repeated)}): each output's values are "
                    "reported under its name, so one would hide the other; give every output "
                    "a name of its own")
        if (self.target_mean is None) != (self.target_std is None):
            raise ConfigError("target_mean and target_std come together")
        if self.target_mean is not None:
            if self.kind != "regression":
                raise ConfigError(f"target standardisation is for regression, not {self.kind}")
            self.target_mean = [float(m) for m in self.target_mean]
            self.target_std = [float(s) for s in self.target_std]
            if len(self.target_mean) != len(self.target_std) or min(self.target_std) <= 0:
                raise ConfigError("target_mean and target_std need one positive std per output")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> TaskSpec:
        """A task as a file stores it; repeated output names (which older files may hold)
        are told apart as `distinct_output_names` does."""
        check_known_keys(cls, data, "task")
        if data.get("names") is not None and data.get("kind") != "classification":
            data = {**data, "names": distinct_output_names(data["names"])}
        return cls(**data)


def _repeated(names: Sequence[str]) -> list[str]:
    counts: dict[str, int] = {}
    for name in names:
        counts[name] = counts.get(name, 0) + 1
    return [name for name, count in counts.items() if count > 1]


def distinct_output_names(names: Sequence[Any]) -> list[str]:
    """`names` with each repeated name told apart by its output ("cat (output 1)", "cat
    (output 2)"), logged: a file's multi-label or regression outputs keyed by name would
    otherwise fold into one."""
    names = [str(n) for n in names]
    repeated = set(_repeated(names))
    if not repeated:
        return names
    distinct = [f"{n} (output {i + 1})" if n in repeated else n for i, n in enumerate(names)]
    log.warning("output names repeat (%s): reported as %s", ", ".join(map(repr, repeated)),
                ", ".join(repr(d) for d, n in zip(distinct, names, strict=True) if n in repeated))
    return distinct


def _loss_key(name: str) -> str:
    """"Smooth-L1 Loss" -> "smooth_l1": lower case, "_" for spaces and dashes, no "loss" at
    the end (torch's class names: "MSELoss", "SmoothL1Loss")."""
    key = "_".join(name.strip().lower().replace("-", " ").split())
    return key.removesuffix("loss").rstrip("_") or key


def loss_suggestion(loss: str, allowed: Sequence[str]) -> str:
    """" Did you mean 'l1' (mean absolute error)?" for a common name of a loss ("mae", "ce",
    "smooth_l1", "MSELoss"; LOSS_ALIASES) in `allowed`; for one of another task's losses, which
    task takes it; else `did_you_mean`'s spelling match ("" when none is close)."""
    if not isinstance(loss, str):
        return ""
    key = _loss_key(loss)
    name = LOSS_ALIASES.get(key, key)
    if name not in LOSS_MEANINGS:
        return did_you_mean(loss, allowed)
    tasks = " or ".join(f"task={kind}" for kind, names in LOSSES.items() if name in names)
    if name == loss:  # vitkit's own name, of another task
        return f" {loss!r} ({LOSS_MEANINGS[name]}) is a loss of {tasks}."
    if name in allowed:
        return f" Did you mean {name!r} ({LOSS_MEANINGS[name]})?"
    return f" {loss!r} is {name!r} here ({LOSS_MEANINGS[name]}), a loss of {tasks}."
